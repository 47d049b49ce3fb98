"""Runners: one causal LM and its KV cache behind two operations.

``extend(tokens, keep)`` feeds ``k`` new tokens and returns the logits rows that
predict the token after each of the last ``keep`` of them; ``crop(length)``
forgets everything after the first ``length`` tokens. Methods never touch
model internals, so another way of running a model is another runner. A token tree
(``tree/loop.py``) also needs ``extend_masked``: tokens at given positions under
a given attention mask, and the K/V of ``cache.layers`` to compact.
"""

from __future__ import annotations

import inspect
import time
from typing import Protocol

import torch
from torch import Tensor

from ..errors import ArgumentError
from .stats import ModelStats

RUNNERS = ("eager", "compiled", "compiled+autotune")  # every runner but eager is a StaticRunner


class Runner(Protocol):
    length: int
    stats: ModelStats

    def extend(self, tokens: list[int], keep: int) -> Tensor: ...

    def crop(self, length: int) -> None: ...


class HFRunner:
    """A Hugging Face transformers causal LM with a cropped ``DynamicCache``."""

    def __init__(
        self,
        model: torch.nn.Module,
        vocab_size: int,
        stats: ModelStats | None = None,
        out_device: torch.device | None = None,
    ):
        from transformers import DynamicCache

        self.model = model
        self.vocab_size = vocab_size
        self.device = next(model.parameters()).device
        self.out_device = out_device or self.device
        self.cache = DynamicCache()
        self.length = 0
        self.followers: list = []  # told of a token tree's compaction of the cache (``compact(start, keep)``)
        self.stats = stats if stats is not None else ModelStats()
        self.sync = self.device.type == "cuda"  # synchronise after each forward, so that forward_time_s times it
        self._keep_arg = "logits_to_keep" in inspect.signature(model.forward).parameters

    def extend(self, tokens: list[int], keep: int) -> Tensor:
        """Feed ``tokens``; return ``[keep, V]`` logits for the last ``keep`` of them."""
        return self._forward(tokens, keep, {})

    def extend_masked(self, tokens: list[int], keep: int, positions: list[int], visible: Tensor) -> Tensor:
        """Feed ``tokens`` at ``positions``, token ``i`` attending to the cache slots where ``visible[i]`` is
        True (``[len(tokens), length + len(tokens)]``: a token tree's mask); the logits as ``extend``'s."""
        dtype = next(self.model.parameters()).dtype
        inputs = {
            "attention_mask": additive_mask(visible.to(self.device), dtype)[None, None],
            "position_ids": torch.tensor([positions], device=self.device),
        }
        return self._forward(tokens, keep, inputs)

    def _forward(self, tokens: list[int], keep: int, inputs: dict) -> Tensor:
        ids = torch.tensor([tokens], dtype=torch.long, device=self.device)
        kwargs = {"logits_to_keep": keep} if self._keep_arg else {}
        start = time.perf_counter()
        out = self.model(input_ids=ids, past_key_values=self.cache, use_cache=True, **inputs, **kwargs)
        logits = as_rows(out.logits[0, -keep:, : self.vocab_size], self.out_device)
        if self.sync:
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


def additive_mask(visible: Tensor, dtype: torch.dtype) -> Tensor:
    """A boolean attention mask (True: attend) as the additive one a model takes: 0 or the dtype's minimum."""
    return torch.zeros(visible.shape, dtype=dtype, device=visible.device).masked_fill_(~visible, torch.finfo(dtype).min)


def as_rows(logits: Tensor, device: torch.device, copy: bool = False) -> Tensor:
    """Logits rows as the decoder combines them: float32 or float64, on the decoder's device (a model
    spread over devices, or on another one than its partners, ends on its own last device)."""
    dtype = logits.dtype if logits.dtype in (torch.float32, torch.float64) else torch.float32
    return logits.to(device=device, dtype=dtype, copy=copy)


def set_runner(model: torch.nn.Module, runner: str, backend: str | None = None) -> torch.nn.Module:
    """Choose the runner a model decodes with: ``eager`` (``HFRunner``), ``compiled`` (``StaticRunner``;
    ``backend``: a ``torch.compile`` backend, default inductor) or ``compiled+autotune`` (the same, its
    matrix products chosen by inductor's autotuning; see ``static.py``)."""
    if runner not in RUNNERS:
        raise ArgumentError(f"runner={runner!r}: expected one of {', '.join(RUNNERS)}")
    model.__dict__["_specens_runner"] = (runner, backend)
    return model


def runner_of(model: torch.nn.Module) -> tuple[str, str | None]:
    """The runner and compile backend chosen for ``model`` (``set_runner``; default eager)."""
    return model.__dict__.get("_specens_runner", ("eager", None))
