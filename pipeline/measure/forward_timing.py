"""What one forward of k new tokens costs a model on a runner, timed in interleaved rounds (``bench/runners.py``,
``pipeline models``, the benchmark's cost model)."""

from __future__ import annotations

import contextlib
import random
import statistics
import time

import torch
from torch import nn

from ..decoding import generate
from ..decoding.static import make_runner
from ..decoding.stats import ModelStats


def compiling(runner: str):
    """Where graphs are compiled: inductor's weight freezing on for ``compiled+freeze``."""
    return torch._inductor.config.patch(freezing=True) if runner == "compiled+freeze" else contextlib.nullcontext()


class Contender:
    """One model on one runner, measured against the others in interleaved rounds, made ready: every graph
    compiled, a runner (``live``) holding ``context`` tokens (forwards of k new tokens after them) and a prompt for
    generations of ``new`` tokens."""

    def __init__(self, model: nn.Module, runner: str, ks: list[int], context: int, new: int = 0):
        self.model, self.runner, self.ks, self.context = model, runner, ks, context
        rng = random.Random(1)
        self.ids = [rng.randrange(model.config.vocab_size) for _ in range(context + max(ks))]
        device = next(model.parameters()).device
        with compiling(runner), torch.inference_mode():
            self.live = make_runner(model, model.config.vocab_size, ModelStats(), context + max(ks) + 1, device)
            self.live.extend(self.ids[:context], 1)
        if new:
            self.generation(new)  # warm-up, and the graphs of a generation's cache size

    def forwards(self) -> dict[int, float]:
        """Seconds of one forward of each k new tokens."""
        out = {}
        with compiling(self.runner), torch.inference_mode():
            for k in self.ks:
                start = time.perf_counter()
                self.live.extend(self.ids[self.context : self.context + k], 1)  # synchronises the device
                out[k] = time.perf_counter() - start
                self.live.crop(self.context)
        return out

    def generation(self, new: int) -> tuple[int, float]:
        """(new tokens, wall seconds) of ``large_model`` decoding after the context as a prompt."""
        with compiling(self.runner):
            stats = generate([self.model], self.ids[: self.context], "large_model", max_new_tokens=new).stats
        return stats.new_tokens, stats.wall_time_s


def interleaved(contenders: list[Contender], repeats: int, new: int) -> tuple[dict, dict]:
    """Every contender's forwards and one generation in turn, the order rotated each round, after two warm-up
    rounds, so that a drift of a shared machine hits every runner alike. Returns, by runner, the seconds of
    each k's forwards and the (tokens, seconds) of each generation."""
    forwards = {p.runner: {k: [] for k in p.ks} for p in contenders}
    runs: dict[str, list] = {p.runner: [] for p in contenders}
    for rep in range(repeats + 2):
        for p in contenders[rep % len(contenders) :] + contenders[: rep % len(contenders)]:
            times = p.forwards()
            run = p.generation(new) if new else None
            if rep >= 2:
                for k, seconds in times.items():
                    forwards[p.runner][k].append(seconds)
                if run is not None:
                    runs[p.runner].append(run)
    return forwards, runs


def forward_costs(model: nn.Module, runner: str, ks: list[int], context: int, repeats: int) -> dict[int, float]:
    """Median ms of one forward of k new tokens after ``context`` tokens, k interleaved."""
    forwards, _ = interleaved([Contender(model, runner, ks, context)], repeats, 0)
    return {k: statistics.median(v) * 1000 for k, v in forwards[runner].items()}
