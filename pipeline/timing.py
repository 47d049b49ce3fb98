"""Timing a run honestly: wall and CPU time, signs that something else competed for the CPU, provenance.

A timed region records its wall time and two interference signals that work on any Linux machine
(docs/speed.md, "Interference"): ``psi_some_s``, the growth of the CPU pressure "some" total (this process's
cgroup's ``cpu.pressure`` where cgroup v2 gives one, else the machine's), and ``nivcsw``, this process's
involuntary context switches. ``Thresholds`` were calibrated on a 2-core machine: quiet runs stayed under 0.10 s/s
of pressure and 250 preemptions/s, a competing process gave 0.22-0.50 s/s, or 5,500 preemptions/s with passive
OpenMP threads. Wall time far above CPU time is no signal: with two threads a quiet region's CPU time is twice its
wall time and a contended one's about equal to it.
"""

from __future__ import annotations

import contextlib
import platform
import resource
import socket
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


@dataclass(frozen=True)
class Thresholds:
    """When a timed region counts as interfered (per second of its wall time)."""

    psi_share: float = 0.15  # seconds of CPU pressure per second
    nivcsw_per_s: float = 1000.0  # involuntary context switches per second

    # a few milliseconds of pressure or a few preemptions are no evidence in a run of milliseconds
    min_psi_s: float = 0.02
    min_nivcsw: int = 10

    def interfered(self, probe: dict[str, Any]) -> bool:
        wall = probe["wall_s"]
        if wall <= 0:
            return False
        psi, switches = probe.get("psi_some_s"), probe["nivcsw"]
        pressure = psi is not None and psi >= self.min_psi_s and psi / wall > self.psi_share
        return pressure or (switches >= self.min_nivcsw and switches / wall > self.nivcsw_per_s)


class Probe:
    """Wall time, CPU time and interference signals of one region: ``with Probe() as p: ...; p.result``."""

    def __enter__(self) -> Probe:
        self._psi = _psi_some_us()
        self._usage = resource.getrusage(resource.RUSAGE_SELF)
        self._wall = time.perf_counter()
        return self

    def __exit__(self, *exc) -> None:
        wall = time.perf_counter() - self._wall
        usage = resource.getrusage(resource.RUSAGE_SELF)
        psi = _psi_some_us()
        self.result = {
            "wall_s": wall,
            "cpu_s": (usage.ru_utime + usage.ru_stime) - (self._usage.ru_utime + self._usage.ru_stime),
            "psi_some_s": (psi - self._psi) / 1e6 if psi is not None and self._psi is not None else None,
            "nivcsw": usage.ru_nivcsw - self._usage.ru_nivcsw,
        }


def provenance(device: Any = None, engines: Iterable[str] = ("eager",)) -> dict[str, Any]:
    """Where a sample was timed: host, device, threads, engine. Samples timed differently are never pooled."""
    import torch
    import transformers

    dev = str(device) if device is not None else "cpu"
    name = platform.processor() or platform.machine()
    if dev.startswith("cuda") and torch.cuda.is_available():
        name = torch.cuda.get_device_name(torch.device(dev))
    return {
        "host": socket.gethostname(),
        "device": f"{dev} ({name})",
        "threads": torch.get_num_threads(),
        "engine": f"transformers {transformers.__version__} {'+'.join(sorted(engines))}, torch {torch.__version__}",
    }
