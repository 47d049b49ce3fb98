"""What each engine does (``decoding/engines.py`` holds what each engine is): one module each, by plain imports.

``ours.py`` (our decoder), ``transformers.py`` (its ``hf_*`` methods, run by our ``generate``) and ``vllm.py``
(workers in vLLM's environment). A generation job asks ``behaviour(engine).runs(cell, stack)`` for a ``Runs``; the
config check asks ``availability``, ``cannot_load`` and ``head_problem``. To add an engine: its record in
``decoding/engines.py``, its ``Behaviour`` in a module here, and one line in ``BEHAVIOURS`` (docs/extending.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from ..decoding.engines import Engine
from .base import Behaviour
from .ours import OURS
from .transformers import TRANSFORMERS
from .vllm import VLLM

BEHAVIOURS: Mapping[str, Behaviour] = MappingProxyType({"ours": OURS, "transformers": TRANSFORMERS, "vllm": VLLM})


def behaviour(engine: Engine) -> Behaviour:
    """What ``engine`` does (its record's name keys it)."""
    return BEHAVIOURS[engine.name]


__all__ = ["BEHAVIOURS", "Behaviour", "behaviour"]
