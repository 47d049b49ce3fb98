"""Transformers' behaviour (``decoding/engines.py``'s ``transformers``): its own speculative methods (``hf_*``) are
run by our ``generate`` beside ours (``decoding/peers.py``), on the models our decoder loads."""

from __future__ import annotations

from .base import Behaviour
from .ours import runs

TRANSFORMERS = Behaviour(runs)
