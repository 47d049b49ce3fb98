"""The shared decoder: every decoding method, lossless, behind one ``generate``.

See ``docs/algorithms.md`` for the contract each method keeps.
"""

from .ensembles import ENSEMBLES, register_ensemble
from .methods import GenerationResult, Settings, decode, generate
from .proposers import register_proposer
from .sampling import Sampling
from .spec import method_names
from .stats import GenerationStats, ModelStats
from .union import UnionVocab, check_joinable

__all__ = [
    "ENSEMBLES",
    "GenerationResult",
    "GenerationStats",
    "ModelStats",
    "Sampling",
    "Settings",
    "UnionVocab",
    "check_joinable",
    "decode",
    "generate",
    "method_names",
    "register_ensemble",
    "register_proposer",
]
