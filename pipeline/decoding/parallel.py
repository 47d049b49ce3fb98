"""Concurrent forwards: the members' forwards for one position run at the same time (``E_p`` methods).

The tokens are those of the standard ensemble ``E``: every member computes
exactly the rows it computes there, only the scheduling of the forwards
differs, and the target is formed and sampled on the calling thread after
all of them are done.

* CPU: a pool of one thread per member (torch releases the GIL inside its
  ops). Intra-op threads are counted per process, so the process's thread
  budget (``torch.get_num_threads()``) is split evenly between the members,
  at least one thread each: with a budget of one thread the members still
  run one thread each, so ``E_p`` then uses as many threads as it has
  members while ``E`` uses one. The budget is restored when decoding ends.
* CUDA: each member's forward is issued on its own stream, and the calling
  thread's stream waits for all of them. Members on different devices run
  concurrently by the threads alone.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from .engine import Member


def _device(member: Member) -> torch.device:
    return getattr(member.runner, "device", torch.device("cpu"))


class ConcurrentForwards:
    """Catch every member up at once; a context manager that owns the thread pool."""

    def __init__(self, members: list[Member]):
        self.members = members
        self.budget = torch.get_num_threads()
        self.threads_per_member = max(1, self.budget // len(members))
        self.streams = [torch.cuda.Stream(_device(m)) if _device(m).type == "cuda" else None for m in members]
        self.pool: ThreadPoolExecutor | None = None

    def __enter__(self) -> ConcurrentForwards:
        self.pool = ThreadPoolExecutor(
            len(self.members), initializer=torch.set_num_threads, initargs=(self.threads_per_member,)
        )
        return self

    def __exit__(self, *exc: object) -> None:
        self.pool.shutdown()
        self.pool = None
        torch.set_num_threads(self.budget)

    def catch_up(self, tokens: list[int], committed: int) -> None:
        """``Member.catch_up`` of every member, concurrently; returns when all rows are ready."""
        futures = [self.pool.submit(self._one, i, tokens, committed) for i in range(len(self.members))]
        for f in futures:
            f.result()  # re-raises a member's error here
        for member, stream in zip(self.members, self.streams):
            if stream is not None:
                torch.cuda.current_stream(_device(member)).wait_stream(stream)

    def _one(self, i: int, tokens: list[int], committed: int) -> None:
        member, stream = self.members[i], self.streams[i]
        with torch.inference_mode():  # the mode is per thread: the pool's threads start without it
            if stream is None:
                member.catch_up(tokens, committed)
                return
            stream.wait_stream(torch.cuda.default_stream(_device(member)))
            with torch.cuda.stream(stream):
                member.catch_up(tokens, committed)
