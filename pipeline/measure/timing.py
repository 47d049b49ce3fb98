"""Timing a run honestly: wall and CPU time, signs that something else competed for the CPU (where and by which run
a sample was timed: ``pipeline/provenance.py``).

A timed region records its wall time and three interference signals (docs/speed.md, "Interference"):
``wait_s``, the seconds this process's threads spent runnable on a run queue, waiting for a CPU
(``/proc/self/task/*/schedstat``), the direct measure of what a competitor takes from the run; ``psi_some_s``,
the growth of the CPU pressure "some" total (this process's cgroup's ``cpu.pressure`` where cgroup v2 gives one,
else the machine's), used where the kernel gives no run-queue delay; and ``nivcsw``, this process's involuntary
context switches. The machine's pressure counts any task that waits, ours or not: measured on a 2-core machine,
two busy processes at ``nice 19`` beside a one-thread run gave 0.50 s/s of machine pressure but 0.000 s/s of the
run's own wait and 4 preemptions/s (at normal priority: 0.45 s/s of its own wait, 114/s;
``python -m pipeline.measure.competitors``), so a run is judged by its own wait. Wall time far above CPU time is no
signal: with two threads a quiet region's CPU time is twice its wall time and a contended one's about equal to it.
It also records which other processes took CPU time while it ran (``beside``).
"""

from __future__ import annotations

import contextlib
import os
import resource
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any


def _psi_file() -> Path:
    """This process's cgroup (v2) CPU pressure file, else the machine's."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            if line.startswith("0::"):
                own = Path("/sys/fs/cgroup") / line[3:].lstrip("/") / "cpu.pressure"
                if own.is_file():
                    return own
    return Path("/proc/pressure/cpu")


PSI = _psi_file()


def _psi_some_us() -> int | None:
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in PSI.read_text().splitlines():
            if line.startswith("some"):
                return int(line.rsplit("total=", 1)[1])
    return None


def _wait_s() -> float | None:
    """Seconds this process's threads have waited on a run queue for a CPU (None where the kernel does not say)."""
    total, found = 0, False
    for stat in Path("/proc/self/task").glob("*/schedstat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            total += int(stat.read_text().split()[1])  # cpu time, run-queue wait, timeslices; in ns
            found = True
    return total / 1e9 if found else None


@dataclass(frozen=True)
class Thresholds:
    """When a timed region counts as interfered (per second of its wall time)."""

    wait_share: float = 0.20  # seconds this process waited for a CPU per second (quiet runs: at most 0.12)
    psi_share: float = 0.15  # seconds of CPU pressure per second, where the kernel gives no run-queue wait
    nivcsw_per_s: float = 1000.0  # involuntary context switches per second

    # a few milliseconds of waiting or a few preemptions are no evidence in a run of milliseconds
    min_psi_s: float = 0.02
    min_nivcsw: int = 10

    def degree(self, probe: dict[str, Any]) -> float:
        """How far over its thresholds a region's worst signal was (above 1: interfered; 0: no evidence)."""
        wall = probe["wall_s"]
        if wall <= 0:
            return 0.0
        waited, share = probe.get("wait_s"), self.wait_share
        if waited is None:  # an older journal's attempt, or a kernel without schedstat: the pressure instead
            waited, share = probe.get("psi_some_s"), self.psi_share
        pressure = waited / wall / share if waited is not None and waited >= self.min_psi_s else 0.0
        switches = probe["nivcsw"] / wall / self.nivcsw_per_s if probe["nivcsw"] >= self.min_nivcsw else 0.0
        return max(pressure, switches)

    def interfered(self, probe: dict[str, Any]) -> bool:
        return self.degree(probe) > 1

    def worst(self, attempt: dict[str, Any]) -> float:
        """The degree of a timed pair's worse run (an attempt: its ``method`` and ``baseline`` regions)."""
        return max((self.degree(attempt[r]) for r in ("method", "baseline") if attempt.get(r)), default=0.0)


TICK_S = 1 / os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 0.01
MIN_BESIDE_S = 0.02  # the least CPU time a process beside a region is named for
BESIDE_SHOWN = 5  # the most processes named per region, those that took most


BUSY_SHARE = 0.1  # a worker's thread that ran this share of a region's wall time computes for it


def _worker_threads(pids: Iterable[int]) -> dict[tuple[int, str], tuple[int, int, int]]:
    """Each thread of ``pids`` (a job's worker processes): its CPU ticks, run-queue wait (ns) and involuntary
    context switches so far."""
    out = {}
    for pid in pids:
        for task in Path(f"/proc/{pid}/task").glob("*"):
            with contextlib.suppress(OSError, ValueError, IndexError):
                fields = (task / "stat").read_bytes().rsplit(b")", 1)[1].split()
                waited = int((task / "schedstat").read_text().split()[1])
                status = (task / "status").read_text()
                switches = int(status.split("nonvoluntary_ctxt_switches:")[1].split()[0])
                out[(pid, task.name)] = (int(fields[11]) + int(fields[12]), waited, switches)
    return out


def _workers_took(before: dict, after: dict, wall: float) -> tuple[float, float | None, int]:
    """Between two ``_worker_threads`` readings: the workers' CPU seconds (every thread), and the run-queue wait
    and preemptions of the threads that computed (ran ``BUSY_SHARE`` of the wall time or more). A worker's helper
    threads (vLLM's dozens of gloo loops wake, find nothing and sleep) wait for a CPU whenever the machine is
    busy, while the thread that generates never waits: their waits say nothing of the run."""
    cpu, waited, switches, found = 0.0, 0, 0, False
    for key, (ticks, wait_ns, nivcsw) in after.items():
        t0, w0, s0 = before.get(key, (0, 0, 0))
        ran = (ticks - t0) * TICK_S
        cpu += ran
        if ran >= BUSY_SHARE * wall:
            waited, switches, found = waited + wait_ns - w0, switches + nivcsw - s0, True
    return cpu, waited / 1e9 if found else 0.0, switches


def _cpu_ticks() -> dict[int, int]:
    """Every other process's CPU time so far, in clock ticks (``/proc/<pid>/stat``: utime + stime)."""
    out, own = {}, os.getpid()
    with contextlib.suppress(OSError):
        for entry in os.scandir("/proc"):
            if entry.name.isdigit() and int(entry.name) != own:
                with contextlib.suppress(OSError, ValueError, IndexError):
                    fields = Path(f"/proc/{entry.name}/stat").read_bytes().rsplit(b")", 1)[1].split()
                    out[int(entry.name)] = int(fields[11]) + int(fields[12])
    return out


def process_label(pid: int) -> str:
    """A process as the journal names it: ``pipeline <command>`` for a job of this project, ``snakemake``, else
    its program's name (``stress-ng``, ``wandb-core``, ...)."""
    try:
        argv = [a.decode(errors="replace") for a in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0") if a]
        if not argv:  # a kernel thread: its name, bracketed as ps shows it
            return f"[{Path(f'/proc/{pid}/comm').read_text().strip()}]"
    except OSError:
        return "?"  # it has exited since
    for i, arg in enumerate(argv):
        if arg in ("pipeline.cli", "pipeline") and i and argv[i - 1] == "-m":
            return " ".join(["pipeline", *argv[i + 1 : i + 2]])
        if Path(arg).name.startswith("snakemake"):
            return "snakemake"
    return Path(argv[0]).name if argv else "?"


def beside(before: dict[int, int], after: dict[int, int]) -> dict[str, float]:
    """The CPU seconds other processes took during a region, by label, the largest first (a process that began
    within it counts whole)."""
    took: dict[str, float] = {}
    for pid, ticks in after.items():
        used = (ticks - before.get(pid, 0)) * TICK_S
        if used >= MIN_BESIDE_S:
            label = process_label(pid)
            took[label] = took.get(label, 0.0) + used
    return dict(sorted(took.items(), key=lambda kv: -kv[1])[:BESIDE_SHOWN])


class Probe:
    """Wall time, CPU time, interference signals and what else ran of one region: ``with Probe() as p: ...;
    p.result``. ``pids``: worker processes that run the region's work for this one (a vLLM cell's,
    ``pipeline/vllm/engine.py``): their CPU time counts as this process's, and so do the waits and preemptions of
    their threads that computed (``_workers_took``); they are not named beside it."""

    def __init__(self, pids: Iterable[int] = ()):
        self.pids = tuple(pids)

    def __enter__(self) -> Probe:
        self._others = _cpu_ticks()
        self._psi, self._wait = _psi_some_us(), _wait_s()
        self._workers = _worker_threads(self.pids)
        self._usage = resource.getrusage(resource.RUSAGE_SELF)
        self._wall = time.perf_counter()
        return self

    def __exit__(self, *exc) -> None:
        wall = time.perf_counter() - self._wall
        usage = resource.getrusage(resource.RUSAGE_SELF)
        psi, waited = _psi_some_us(), _wait_s()
        cpu, worker_wait, switches = _workers_took(self._workers, _worker_threads(self.pids), wall)
        others = {pid: ticks for pid, ticks in _cpu_ticks().items() if pid not in self.pids}
        self.result = {
            "wall_s": wall,
            "cpu_s": (usage.ru_utime + usage.ru_stime) - (self._usage.ru_utime + self._usage.ru_stime) + cpu,
            "wait_s": waited - self._wait + worker_wait if waited is not None and self._wait is not None else None,
            "psi_some_s": (psi - self._psi) / 1e6 if psi is not None and self._psi is not None else None,
            "nivcsw": usage.ru_nivcsw - self._usage.ru_nivcsw + switches,
            "beside": beside(self._others, others),  # read after the clock stopped: not in wall_s
        }
