"""The compiled runner: a static KV cache and ``torch.compile``d forwards, one graph per bucket of new tokens.

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
* Token trees (``tree/cache.py``) feed under a tree mask: ``extend_masked``
  pads to a bucket of ``TREE_BUCKETS`` (up to 64 new tokens, each padding
  token seeing only itself) and runs graphs of their own taking the mask, over
  the whole cache, as an input (``compile_masked``: before decoding, by
  ``compile_ahead`` or ``prepare_masked``, which also sizes the cache for the
  tree's nodes). The tree's compaction moves K/V inside the static cache.

``compiled+autotune`` compiles the same graphs with inductor's autotuning of
matrix products (``max-autotune``). On a CPU it freezes the weights into the
graph and packs them for inductor's own C++ matrix kernels, which on a
matrix-vector product read the weights about as fast as a plain sum does
(the bundled model, 2 cores: 1.64x the tokens/s of the eager runner with
oneDNN-prepacked layers, 1.94x per one-token forward; docs/benchmarks.md,
benchmarks/runners/). The price: compiling takes minutes per model (about 18 for
SmolLM2-135M on 2 cores, 3 for its 2-layer draft) and each bucket's graph
holds its own packed copy of the weights.

Sliding-window layers roll their buffer and cannot be rolled back, so
models with them are refused; run them with ``runner: eager``.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
from torch import Tensor

from ..errors import ArgumentError
from .runner import HFRunner, Runner, additive_mask, as_rows, runner_of
from .stats import ModelStats

BUCKETS = (1, 2, 4, 8, 16)
TREE_BUCKETS = (*BUCKETS, 32, 64)  # a token tree's forwards (compiled on first use): up to 63 nodes and the root
MIN_CACHE = 256


def bucket(k: int, buckets: tuple[int, ...] = BUCKETS) -> int | None:
    """The padded size of a forward of ``k`` new tokens (``TREE_BUCKETS``: a token tree's masked forward; None:
    too many, run it eagerly)."""
    return next((b for b in buckets if b >= k), None)


def cache_len(needed: int) -> int:
    """A cache size for ``needed`` positions: a power of two, at least ``MIN_CACHE``."""
    return max(MIN_CACHE, 1 << (needed - 1).bit_length())


class _Graphs:
    """One static cache of a model and the compiled forward over it (kept on the model, reused)."""

    def __init__(self, model: torch.nn.Module, length: int, backend: str | None, autotune: bool = False):
        from transformers import StaticCache

        if any(t != "full_attention" for t in getattr(model.config, "layer_types", None) or ["full_attention"]):
            raise ArgumentError(
                f"runner 'compiled' needs full-attention layers; {type(model).__name__} has sliding-window "
                "layers (use runner: eager)"
            )
        self.model, self.length, self.backend, self.autotune = model, length, backend, autotune
        self.busy = False
        self.cache = StaticCache(config=model.config, max_cache_len=length)
        self.device = next(model.parameters()).device
        _make_room(len(BUCKETS))
        self.mode = None  # a custom backend takes none
        if backend in (None, "inductor") and self.device.type == "cuda":
            self.mode = "max-autotune" if autotune else "reduce-overhead"  # both capture CUDA graphs
        elif backend in (None, "inductor") and autotune:
            self.mode = "max-autotune-no-cudagraphs"
        self.compiled: Callable = self._compile(self.forward)
        self.masked: Callable | None = None  # a token tree's forwards, compiled on first use (``compile_masked``)
        self.masked_sizes: set[int] = set()
        with self._compiling():  # every bucket now, not mid-decode
            one = torch.zeros((1, 1), dtype=torch.long, device=self.device)
            self.forward(one, one)  # an eager forward allocates the cache: the graphs see it allocated
            for size in BUCKETS:
                positions = torch.arange(1, 1 + size, device=self.device)[None]
                self.at(1)
                self.compiled(torch.zeros_like(positions), positions)

    def _compile(self, forward: Callable) -> Callable:
        return torch.compile(forward, backend=self.backend or "inductor", mode=self.mode, dynamic=False)

    @contextmanager
    def _compiling(self) -> Iterator[None]:
        """Inference mode and, on a CPU, autotuning's settings: inductor's C++ matrix kernels (aten's where
        they cannot serve), which need the weights frozen into the graph."""
        cpu_kernels = {}
        if self.autotune and self.device.type == "cpu":
            cpu_kernels = dict(freezing=True, max_autotune_gemm_backends="CPP", autotune_fallback_to_aten=True)
        with torch.inference_mode(), torch._inductor.config.patch(cpu_kernels):
            yield

    def compile_masked(self, tokens: int) -> None:
        """Compile the masked forwards (a token tree's) of the buckets up to ``tokens`` new tokens not compiled yet."""
        sizes = [b for b in TREE_BUCKETS if b <= (bucket(tokens, TREE_BUCKETS) or TREE_BUCKETS[-1])]
        todo = [b for b in sizes if b not in self.masked_sizes]
        if not todo:
            return
        _make_room(len(todo))
        if self.masked is None:
            self.masked = self._compile(self.forward_masked)
        with self._compiling():
            for size in todo:
                positions = torch.arange(1, 1 + size, device=self.device)[None]
                mask = torch.zeros((1, 1, size, self.length), dtype=self.dtype, device=self.device)
                self.at(1)
                self.masked(torch.zeros_like(positions), positions, mask)
                self.masked_sizes.add(size)

    @property
    def dtype(self) -> torch.dtype:
        return next(self.model.parameters()).dtype

    def forward(self, ids: Tensor, positions: Tensor) -> Tensor:
        out = self.model(input_ids=ids, position_ids=positions, past_key_values=self.cache, use_cache=True)
        return out.logits

    def forward_masked(self, ids: Tensor, positions: Tensor, mask: Tensor) -> Tensor:
        """A forward under an additive attention mask over the whole cache, ``[1, 1, new tokens, length]``."""
        out = self.model(
            input_ids=ids, position_ids=positions, attention_mask=mask, past_key_values=self.cache, use_cache=True
        )
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
    """A free static cache of ``model`` for ``needed`` positions, with its graphs for the model's runner
    (made on first use and kept on the model; a model used twice in one generation, as its own draft,
    gets two)."""
    pool: list[_Graphs] = model.__dict__.setdefault("_specens_static_graphs", [])
    length = cache_len(needed)
    runner, backend = runner_of(model)
    autotune = runner == "compiled+autotune"
    same = (length, backend, autotune)
    graphs = next((g for g in pool if (g.length, g.backend, g.autotune) == same and not g.busy), None)
    if graphs is None:
        graphs = _Graphs(model, length, backend, autotune)
        pool.append(graphs)
    graphs.busy = True
    return graphs


def compile_ahead(models, lengths, tree_tokens: int = 0) -> None:
    """Compile, before anything is timed, the graphs every generation of up to ``lengths`` positions
    will use (one cache size each) for the models on the compiled runner; ``tree_tokens``: also the masked
    forwards of a token tree of that many nodes and its root."""
    for model in {id(m): m for m in models if runner_of(m)[0] != "eager"}.values():
        chains = {cache_len(n + BUCKETS[-1]) for n in lengths}
        trees = {cache_len(n + tree_tokens + BUCKETS[-1]) for n in lengths} if tree_tokens else set()
        for size in sorted(chains | trees):
            graphs = lease(model, size)
            if size in trees:
                graphs.compile_masked(tree_tokens)
            graphs.busy = False


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
        self.max_len = max_len
        self._lease(model)
        self.length = 0
        self.stats = stats if stats is not None else ModelStats()
        self.pad_id = pad_id
        self.sync = self.device.type == "cuda"  # synchronise after each forward, so that forward_time_s times it

    def extend(self, tokens: list[int], keep: int) -> Tensor:
        """Feed ``tokens``; return ``[keep, V]`` logits for the last ``keep`` of them."""
        size = bucket(len(tokens)) if self.length else None  # the prefill runs eagerly
        positions = torch.arange(self.length, self.length + (size or len(tokens)), device=self.device)[None]
        return self._run(tokens, keep, size, positions, None)

    def extend_masked(self, tokens: list[int], keep: int, positions: list[int], visible: Tensor) -> Tensor:
        """Feed ``tokens`` at ``positions``, token ``i`` attending to the cache slots where ``visible[i]`` is
        True (``[len(tokens), length + len(tokens)]``: a token tree's mask); the logits as ``extend``'s.
        Padded to a tree bucket, each padding token seeing only itself; the prefill, more tokens than the
        buckets compiled, or a bucket past the cache's end run eagerly."""
        k = len(tokens)
        size = bucket(k, TREE_BUCKETS) if self.length else None
        if size not in self.graphs.masked_sizes or self.length + size > self.graphs.length:
            size = None  # a bucket not compiled ahead (``prepare_masked``) runs eagerly: nothing compiles mid-decode
        width = size or k
        seen = torch.zeros((width, self.graphs.length), dtype=torch.bool, device=self.device)
        seen[:k, : self.length + k] = visible.to(self.device)
        pads = torch.arange(k, width, device=self.device)
        seen[pads, self.length + pads] = True
        mask = additive_mask(seen, self.graphs.dtype)
        at = torch.tensor([positions + positions[-1:] * (width - k)], device=self.device)
        return self._run(tokens, keep, size, at, mask[None, None])

    def prepare_masked(self, tokens: int) -> None:
        """Before the first forward: room for ``tokens`` more positions (a token tree's nodes and its root
        past the last committed token) and its masked forwards of up to ``tokens`` new tokens compiled now."""
        if self.length:
            raise ArgumentError("prepare_masked comes before the runner's first forward")
        self.max_len += tokens
        if cache_len(self.max_len + BUCKETS[-1]) != self.graphs.length:
            self._free()  # the graphs of the chain-sized cache are free again
            self._lease(self.graphs.model)
        self.graphs.compile_masked(tokens)

    def _lease(self, model: torch.nn.Module) -> None:
        self.graphs = lease(model, self.max_len + BUCKETS[-1])
        self._free = weakref.finalize(self, setattr, self.graphs, "busy", False)  # free once this runner is gone

    @property
    def cache(self):
        """The static cache (its ``layers``' K/V), as a token tree's compaction reads and moves them."""
        return self.graphs.cache

    def _run(self, tokens: list[int], keep: int, size: int | None, positions: Tensor, mask: Tensor | None) -> Tensor:
        """One forward of ``tokens`` padded to ``positions``' width: compiled (``size``: its bucket) or eager."""
        k = len(tokens)
        if self.length + k > self.max_len:
            raise ArgumentError(f"the static cache holds {self.max_len} positions; {self.length + k} were asked for")
        width = positions.shape[1]
        ids = torch.tensor([tokens + [self.pad_id] * (width - k)], dtype=torch.long, device=self.device)
        start = time.perf_counter()
        self.graphs.at(self.length)
        if mask is None:
            logits = (self.graphs.compiled if size else self.graphs.forward)(ids, positions)
        else:
            logits = (self.graphs.masked if size else self.graphs.forward_masked)(ids, positions, mask)
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
    """The runner chosen for ``model`` (eager unless ``set_runner`` said otherwise);
    ``max_len``: the most positions one generation feeds it."""
    if runner_of(model)[0] != "eager":
        return StaticRunner(model, vocab_size, max_len, stats, out_device=out_device)
    return HFRunner(model, vocab_size, stats, out_device=out_device)
