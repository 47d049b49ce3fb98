"""Runners: one causal LM and its KV cache behind two operations.

``extend(tokens, keep)`` feeds ``k`` new tokens and returns the logits rows that
predict the token after each of the last ``keep`` of them; ``crop(length)``
forgets everything after the first ``length`` tokens. Methods never touch
model internals, so another engine is another runner.
"""

from __future__ import annotations

import inspect
import time
from typing import Protocol

import torch
from torch import Tensor

from .stats import ModelStats


class Runner(Protocol):
    length: int
    stats: ModelStats

    def extend(self, tokens: list[int], keep: int) -> Tensor: ...

    def crop(self, length: int) -> None: ...


class HFRunner:
    """A Hugging Face transformers causal LM with a cropped ``DynamicCache``."""

    def __init__(self, model: torch.nn.Module, vocab_size: int, stats: ModelStats | None = None):
        from transformers import DynamicCache

        self.model = model
        self.vocab_size = vocab_size
        self.device = next(model.parameters()).device
        self.cache = DynamicCache()
        self.length = 0
        self.stats = stats if stats is not None else ModelStats()
        self._sync = self.device.type == "cuda"
        self._keep_arg = "logits_to_keep" in inspect.signature(model.forward).parameters

    def extend(self, tokens: list[int], keep: int) -> Tensor:
        """Feed ``tokens``; return ``[keep, V]`` logits for the last ``keep`` of them."""
        ids = torch.tensor([tokens], dtype=torch.long, device=self.device)
        kwargs = {"logits_to_keep": keep} if self._keep_arg else {}
        start = time.perf_counter()
        out = self.model(input_ids=ids, past_key_values=self.cache, use_cache=True, **kwargs)
        logits = out.logits[0, -keep:, : self.vocab_size]
        if logits.dtype not in (torch.float32, torch.float64):
            logits = logits.float()
        if self._sync:
            torch.cuda.synchronize(self.device)
        self.stats.forward_time_s += time.perf_counter() - start
        self.stats.forward_calls += 1
        self.stats.forwarded_tokens += len(tokens)
        self.cache = out.past_key_values
        self.length += len(tokens)
        return logits

    def crop(self, length: int) -> None:
        if length < self.length:
            self.cache.crop(length - self.length)  # a negative count removes that many tokens
            self.length = length
