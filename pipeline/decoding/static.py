"""The compiled engine: a static KV cache and ``torch.compile``d forwards, one graph per bucket of new tokens.

An eager forward at batch size 1 is bound by kernel launches and Python on a
GPU; a forward over a preallocated cache with fixed shapes can be captured
once (CUDA graphs on a GPU, inductor's fused kernels on a CPU) and replayed.
What that takes, and how this runner does it:

* Fixed shapes. The number of new tokens per forward varies (the verifier's
  ``γ+1``, catch-up after prompt lookup or a rotation, a single token), so it
  is rounded up to a bucket (``BUCKETS``) and padded; each bucket compiles
  once. The prefill and anything longer than the largest bucket run eagerly
  over the same cache.
* Cropping. transformers' ``StaticLayer`` cannot ``crop``: it writes new
  keys at its own ``cumulative_length``. Every forward here first sets that
  length to the runner's, so cropping is only moving ``length`` back. Slots
  past ``length`` (padding, rejected tokens) hold stale keys, which the causal
  mask hides from every real query and the next forward overwrites.
* Attention spans the whole cache, so the cache is sized per generation:
  the prompt, the new tokens and one bucket of padding, rounded up to a power
  of two (``cache_len``), each size its own set of graphs, kept on the model
  for later generations.
* A CUDA graph's outputs are overwritten by its next replay: rows are cloned.

``compiled+autotune`` compiles the same graphs with inductor's autotuning of
matrix products (``max-autotune``). On a CPU it freezes the weights into the
graph and packs them for inductor's own C++ matrix kernels, which on a
matrix-vector product read the weights about as fast as a plain sum does
(the bundled model, 2 cores: 1.64x the tokens/s of the eager engine with
oneDNN-prepacked layers, 1.94x per one-token forward; docs/benchmarks.md,
benchmarks/engines/). The price: compiling takes minutes per model (about 18 for
SmolLM2-135M on 2 cores, 3 for its 2-layer draft) and each bucket's graph
holds its own packed copy of the weights.

Sliding-window layers roll their buffer and cannot be rolled back, so
models with them are refused; run them with ``engine: eager``.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable

import torch
from torch import Tensor

from ..errors import ArgumentError
from .runner import HFRunner, Runner, as_rows, engine_of
from .stats import ModelStats

BUCKETS = (1, 2, 4, 8, 16)
MIN_CACHE = 256


def bucket(k: int) -> int | None:
    """The padded size of a forward of ``k`` new tokens (None: too many, run it eagerly)."""
    return next((b for b in BUCKETS if b >= k), None)


def cache_len(needed: int) -> int:
    """A cache size for ``needed`` positions: a power of two, at least ``MIN_CACHE``."""
    return max(MIN_CACHE, 1 << (needed - 1).bit_length())


class _Graphs:
    """One static cache of a model and the compiled forward over it (kept on the model, reused)."""

    def __init__(self, model: torch.nn.Module, length: int, backend: str | None, autotune: bool = False):
        from transformers import StaticCache

        if any(t != "full_attention" for t in getattr(model.config, "layer_types", None) or ["full_attention"]):
            raise ArgumentError(
                f"engine 'compiled' needs full-attention layers; {type(model).__name__} has sliding-window "
                "layers (use engine: eager)"
            )
        self.model, self.length, self.backend, self.autotune = model, length, backend, autotune
        self.busy = False
        self.cache = StaticCache(config=model.config, max_cache_len=length)
        device = next(model.parameters()).device
        _make_room(len(BUCKETS))
        mode = None  # a custom backend takes none
        if backend in (None, "inductor") and device.type == "cuda":
            mode = "max-autotune" if autotune else "reduce-overhead"  # both capture CUDA graphs
        elif backend in (None, "inductor") and autotune:
            mode = "max-autotune-no-cudagraphs"
        self.compiled: Callable = torch.compile(self.forward, backend=backend or "inductor", mode=mode, dynamic=False)
        # on a CPU, autotuning means inductor's C++ matrix kernels (aten's where they cannot serve), which
        # need the weights frozen into the graph
        cpu_kernels = {}
        if autotune and device.type == "cpu":
            cpu_kernels = dict(freezing=True, max_autotune_gemm_backends="CPP", autotune_fallback_to_aten=True)
        with torch.inference_mode(), torch._inductor.config.patch(cpu_kernels):  # every bucket now, not mid-decode
            one = torch.zeros((1, 1), dtype=torch.long, device=device)
            self.forward(one, one)  # an eager forward allocates the cache: the graphs see it allocated
            for size in BUCKETS:
                positions = torch.arange(1, 1 + size, device=device)[None]
                self.at(1)
                self.compiled(torch.zeros_like(positions), positions)

    def forward(self, ids: Tensor, positions: Tensor) -> Tensor:
        out = self.model(input_ids=ids, position_ids=positions, past_key_values=self.cache, use_cache=True)
        return out.logits

    def at(self, length: int) -> None:
        """Make the next forward write its keys from position ``length`` on."""
        for layer in self.cache.layers:
            layer.cumulative_length.fill_(length)


_GRAPHS = 0


def _make_room(count: int) -> None:
    """Raise dynamo's recompile limits by ``count`` graphs: every ``_Graphs`` compiles the same code
    object, and past the limit dynamo silently runs it eagerly."""
    global _GRAPHS
    _GRAPHS += count
    config = torch._dynamo.config
    config.recompile_limit = max(config.recompile_limit, _GRAPHS)
    config.accumulated_recompile_limit = max(config.accumulated_recompile_limit, 2 * _GRAPHS)


def lease(model: torch.nn.Module, needed: int) -> _Graphs:
    """A free static cache of ``model`` for ``needed`` positions, with its graphs for the model's engine
    (made on first use and kept on the model; a model used twice in one generation, as its own draft,
    gets two)."""
    pool: list[_Graphs] = model.__dict__.setdefault("_specens_static_graphs", [])
    length = cache_len(needed)
    engine, backend = engine_of(model)
    autotune = engine == "compiled+autotune"
    same = (length, backend, autotune)
    graphs = next((g for g in pool if (g.length, g.backend, g.autotune) == same and not g.busy), None)
    if graphs is None:
        graphs = _Graphs(model, length, backend, autotune)
        pool.append(graphs)
    graphs.busy = True
    return graphs


def compile_ahead(models, lengths) -> None:
    """Compile, before anything is timed, the graphs every generation of up to ``lengths`` positions
    will use (one cache size each) for the models on the compiled engine."""
    for model in {id(m): m for m in models if engine_of(m)[0] != "eager"}.values():
        for size in sorted({cache_len(n + BUCKETS[-1]) for n in lengths}):
            lease(model, size).busy = False


class StaticRunner:
    """A causal LM over a static KV cache, its short forwards compiled (see the module docstring)."""

    def __init__(
        self,
        model: torch.nn.Module,
        vocab_size: int,
        max_len: int,
        stats: ModelStats | None = None,
        out_device: torch.device | None = None,
        pad_id: int = 0,
    ):
        self.vocab_size = vocab_size
        self.device = next(model.parameters()).device
        self.out_device = out_device or self.device
        self.graphs = lease(model, max_len + BUCKETS[-1])
        weakref.finalize(self, setattr, self.graphs, "busy", False)  # free again once this runner is gone
        self.max_len = max_len
        self.length = 0
        self.stats = stats if stats is not None else ModelStats()
        self.pad_id = pad_id
        self.sync = self.device.type == "cuda"  # synchronise after each forward, so that forward_time_s times it

    def extend(self, tokens: list[int], keep: int) -> Tensor:
        """Feed ``tokens``; return ``[keep, V]`` logits for the last ``keep`` of them."""
        k = len(tokens)
        if self.length + k > self.max_len:
            raise ArgumentError(f"the static cache holds {self.max_len} positions; {self.length + k} were asked for")
        size = bucket(k) if self.length else None  # the prefill runs eagerly
        width = size or k
        ids = torch.tensor([tokens + [self.pad_id] * (width - k)], dtype=torch.long, device=self.device)
        positions = torch.arange(self.length, self.length + width, device=self.device)[None]
        start = time.perf_counter()
        self.graphs.at(self.length)
        logits = (self.graphs.compiled if size else self.graphs.forward)(ids, positions)
        rows = as_rows(logits[0, k - keep : k, : self.vocab_size], self.out_device, copy=True)
        if self.sync:
            torch.cuda.synchronize(self.device)
        self.stats.forward_time_s += time.perf_counter() - start
        self.stats.forward_calls += 1
        self.stats.forwarded_tokens += k
        self.length += k
        return rows

    def crop(self, length: int) -> None:
        self.length = min(self.length, length)


def make_runner(
    model: torch.nn.Module, vocab_size: int, stats: ModelStats, max_len: int, out_device: torch.device
) -> Runner:
    """The runner of the engine chosen for ``model`` (eager unless ``set_engine`` said otherwise);
    ``max_len``: the most positions one generation feeds it."""
    if engine_of(model)[0] != "eager":
        return StaticRunner(model, vocab_size, max_len, stats, out_device=out_device)
    return HFRunner(model, vocab_size, stats, out_device=out_device)
