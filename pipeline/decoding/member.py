"""What the decoding loops (``loop.py``) hold of each model and how they stop.

A ``Member`` is one model's runner plus the logits rows it computed for
positions not yet committed, so that a row is never computed twice; a
``Stopper`` says why generation ends (``max_new_tokens``, EOS, a stop string).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from .ensembles import check_rows
from .runner import Runner
from .stats import ModelStats


class Member:
    """A runner plus its logits rows for positions ``[first, runner.length]``."""

    def __init__(self, runner: Runner):
        self.runner = runner
        self.rows: Tensor | None = None
        self.first = 0

    @property
    def stats(self) -> ModelStats:
        return self.runner.stats

    def knows(self, pos: int) -> bool:
        """Whether this model has the row predicting the token at ``pos``."""
        return self.rows is not None and self.first <= pos <= self.runner.length

    def span(self, start: int, stop: int) -> Tensor:
        return self.rows[start - self.first : stop - self.first]

    def catch_up(self, tokens: list[int], committed: int) -> None:
        """Feed ``tokens[runner.length:]``; keep the rows for positions >= ``committed``."""
        start = self.runner.length
        if start >= len(tokens):
            return
        end = len(tokens)  # the last new row predicts position `end`
        keep = min(end - start, end - committed + 1)
        rows = check_rows(self.runner.extend(tokens[start:], keep), self.runner, keep)
        first_new = end - keep + 1
        if self.rows is not None and first_new == start + 1 and self.first <= start:
            old = self.rows[max(committed - self.first, 0) :]
            if old.shape[0]:
                rows = torch.cat([old, rows])
                first_new = start + 1 - old.shape[0]
        self.rows, self.first = rows, first_new

    def rewind(self, length: int) -> None:
        """Forget every token from position ``length`` on."""
        self.runner.crop(length)
        if self.rows is not None:
            last = self.runner.length
            self.rows = self.rows[: last - self.first + 1] if last >= self.first else None


class Stopper:
    """Stop conditions: ``max_new_tokens``, EOS ids and stop strings."""

    def __init__(
        self,
        max_new_tokens: int,
        eos_ids: set[int],
        stop_strings: Sequence[str] = (),
        decode: Callable[[list[int]], str] | None = None,
    ):
        self.max_new_tokens = max_new_tokens
        self.eos_ids = eos_ids
        self.stop_strings = list(stop_strings)
        self.decode = decode
        # a stop string is found in the decoded tail of this many tokens
        self.window = max((len(s) for s in self.stop_strings), default=0) + 8

    def reason(self, tokens: list[int], prompt_len: int, end: int) -> str | None:
        """Why generation stops after ``tokens[end - 1]`` (None: go on); no copy of the output."""
        if tokens[end - 1] in self.eos_ids:
            return "eos"
        if self.stop_strings:
            tail = self.decode(tokens[max(prompt_len, end - self.window) : end])
            if any(s in tail for s in self.stop_strings):
                return "stop_string"
        if end - prompt_len >= self.max_new_tokens:
            return "max_new_tokens"
        return None
