"""Concurrent forwards: the members' forwards for one position run at the same time (``E_p`` methods).

The tokens are those of the standard ensemble ``E``: every member computes
exactly the rows it computes there, only the scheduling of the forwards
differs, and the target is formed and sampled on the calling thread after
all of them are done.

* CUDA: each member's forward is launched from the calling thread on its own
  stream (after the work already queued on its device's current stream),
  without the per-forward device synchronisation the runners otherwise time
  with: kernel launches return at once, so the members' kernels overlap on
  the device (or on several devices) while the host launches the next one.
  Threads are not used for GPU members: a forward launched from a second
  thread gains nothing over an asynchronous launch, contends for the GIL with
  the first, and CUDA graphs recorded on one thread (the compiled runners')
  are not to be replayed or re-recorded from another. Once every member is
  launched, the calling thread waits for each member's stream; a member's
  ``forward_time_s`` is its launch time plus that common wait, so overlapping
  forwards are counted in each.
  Members on the compiled runner are the exception: inductor's CUDA graphs
  of one device share one memory pool, each graph's buffers placed on the
  assumption that the graphs run one after another, so two replayed at the
  same time on two streams overwrite each other's intermediates (NaN logits
  for a 1B model with a 68M one on an H100). Their forwards are launched on
  the device's current stream, one after another, as ``E`` does; eager
  members beside them still get their own streams.
* CPU: a pool of one thread per CPU member (torch releases the GIL inside its
  ops), the process's thread budget (``torch.get_num_threads()``) split evenly
  between them, at least one thread each (``docs/decoder.md``), and restored
  when decoding ends.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from .member import Member


def _device(member: Member) -> torch.device:
    return getattr(member.runner, "device", torch.device("cpu"))


def _model_runner(member: Member):
    """The runner that runs the member's model: its own, or the one a union-vocabulary member wraps."""
    return getattr(member.runner, "inner", member.runner)


def _graphed(member: Member) -> bool:
    """Whether the member's forwards replay CUDA graphs from the device's shared pool (the compiled runner)."""
    from .static import StaticRunner

    return isinstance(_model_runner(member), StaticRunner)


class ConcurrentForwards:
    """Catch every member up at once; a context manager that owns the CPU members' thread pool."""

    def __init__(self, members: list[Member]):
        self.members = members
        self.gpu = [i for i, m in enumerate(members) if _device(m).type == "cuda"]
        self.cpu = [i for i, m in enumerate(members) if _device(m).type != "cuda"]
        self.budget = torch.get_num_threads()
        self.threads_per_member = max(1, self.budget // len(members))
        # a stream of its own per eager GPU member; compiled ones stay on the device's current stream (docstring)
        self.streams = {i: torch.cuda.Stream(_device(members[i])) for i in self.gpu if not _graphed(members[i])}
        self.pool: ThreadPoolExecutor | None = None
        self._synced: dict[int, bool] = {}

    def __enter__(self) -> ConcurrentForwards:
        if self.cpu:
            self.pool = ThreadPoolExecutor(
                len(self.cpu), initializer=torch.set_num_threads, initargs=(self.threads_per_member,)
            )
        for i in self.gpu:  # the streams' wait below replaces each forward's own synchronisation
            runner = _model_runner(self.members[i])
            if hasattr(runner, "sync"):
                self._synced[i], runner.sync = runner.sync, False
        return self

    def __exit__(self, *exc: object) -> None:
        if self.pool is not None:
            self.pool.shutdown()
            self.pool = None
            torch.set_num_threads(self.budget)
        for i, sync in self._synced.items():
            _model_runner(self.members[i]).sync = sync
        self._synced.clear()

    def catch_up(self, tokens: list[int], committed: int) -> None:
        """``Member.catch_up`` of every member, concurrently; returns when all rows are ready."""
        futures = [self.pool.submit(self._on_cpu, i, tokens, committed) for i in self.cpu]
        launched = {}
        streams = {
            i: self.streams[i] if i in self.streams else torch.cuda.current_stream(_device(self.members[i]))
            for i in self.gpu
        }
        for i in self.gpu:
            member, stream = self.members[i], streams[i]
            before = member.runner.stats.forward_time_s
            stream.wait_stream(torch.cuda.current_stream(_device(member)))
            with torch.cuda.stream(stream):
                member.catch_up(tokens, committed)
            launched[i] = member.runner.stats.forward_time_s != before
        for f in futures:
            f.result()  # re-raises a member's error here
        start = time.perf_counter()
        for i in self.gpu:
            streams[i].synchronize()
        waited = time.perf_counter() - start
        for i in self.gpu:
            member = self.members[i]
            torch.cuda.current_stream(_device(member)).wait_stream(streams[i])
            if launched[i]:
                member.runner.stats.forward_time_s += waited

    def _on_cpu(self, i: int, tokens: list[int], committed: int) -> None:
        with torch.inference_mode():  # the mode is per thread: the pool's threads start without it
            self.members[i].catch_up(tokens, committed)
