"""The shared decoder: every decoding method, lossless, behind one ``generate``.

See ``docs/algorithms.md`` for the contract each method keeps.
"""

from .ensemble import ENSEMBLES, register_ensemble
from .methods import GenerationResult, generate, method_names
from .sampling import Sampling
from .stats import GenerationStats, ModelStats

__all__ = [
    "ENSEMBLES",
    "GenerationResult",
    "GenerationStats",
    "ModelStats",
    "Sampling",
    "generate",
    "method_names",
    "register_ensemble",
]
