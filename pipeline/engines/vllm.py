"""vLLM's behaviour (``decoding/engines.py``'s ``vllm``): workers in vLLM's own environment (``pipeline/vllm``)."""

from __future__ import annotations

from ..vllm.eagle import entry_problem
from ..vllm.env import availability, unsupported
from ..vllm.runs import vllm_runs
from .base import Behaviour

VLLM = Behaviour(vllm_runs, availability, unsupported, entry_problem)
