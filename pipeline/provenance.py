"""What made a result: the library versions, the commit, the machine and the run, recorded beside every result.

One home for them: a generation job's ``environment`` (its meta file), where each
sample was timed (``provenance``: samples timed differently are never pooled) and by which run (``run_record``:
a resume or a SLURM requeue shows), the versions, commit and machine of an experiment's ``results.json``
(``versions``, ``git_state``, ``machine``), what a trained draft's weights depend on (``weights_versions``), and a
benchmark record's machine (``bench/methods.py``, all of them).
"""

from __future__ import annotations

import os
import platform
import re
import shutil
import socket
import subprocess
import time
from collections.abc import Iterable
from importlib import metadata
from pathlib import Path
from typing import Any

from . import ROOT

PROCESS_START = time.time()  # this module is imported as a job starts: the run a sample belongs to
LIBRARIES = ("torch", "transformers", "snakemake", "lm_eval", "wandb", "pandas", "numpy", "scipy")


def versions() -> dict[str, str | None]:
    """Installed versions of the libraries the results depend on (None: not installed)."""
    out = {}
    for name in LIBRARIES:
        try:
            out[name] = metadata.version(name.replace("_", "-"))
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def git_state(root: Path = ROOT) -> dict[str, Any]:
    """The commit of the checkout and whether its tree had uncommitted changes (None outside a git checkout)."""

    def git(*args: str) -> str | None:
        try:
            run = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return run.stdout if run.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    status = git("status", "--porcelain", "--untracked-files=no")
    return {"commit": commit.strip() if commit else None, "dirty": None if status is None else bool(status.strip())}


def machine() -> dict[str, Any]:
    """The machine the results were aggregated on (each cell's own timing host is in its speed record)."""
    cpu = None
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    gpus: list[str] = []
    if shutil.which("nvidia-smi"):
        try:
            run = subprocess.run(
                ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True, timeout=30
            )
            gpus = [g.strip() for g in run.stdout.splitlines() if g.strip()] if run.returncode == 0 else []
        except (OSError, subprocess.TimeoutExpired):
            pass
    return {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpu": cpu or platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "gpus": gpus,
    }


def environment() -> dict[str, Any]:
    """The generation job's libraries, platform, threads and device (its ``<out>.meta.json``)."""
    import torch
    import transformers

    info = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_threads": torch.get_num_threads(),
        "cuda": torch.cuda.is_available(),
    }
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
    return info


def run_record() -> dict[str, Any]:
    """Which run of a job generated a sample: when the process started and, under SLURM, its job and how many
    times SLURM had requeued it (a preemption or a node failure). A cell whose samples come from several runs
    was resumed; its speed record lists them (``runs``)."""
    job = os.environ.get("SLURM_JOB_ID")
    return {
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(PROCESS_START)),
        "slurm_job": job,
        "restarts": slurm_restarts(job),
    }


def slurm_restarts(job: str | None) -> int | None:
    """How many times SLURM requeued ``job``: ``SLURM_RESTART_COUNT`` where the batch script passed it on, else
    ``scontrol show job`` (a job step started by srun does not see it); None outside SLURM or unknown."""
    value = os.environ.get("SLURM_RESTART_COUNT", "")
    if value.isdigit():
        return int(value)
    if not job:
        return None
    try:
        shown = subprocess.run(["scontrol", "show", "job", job], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    found = re.search(r"\bRestarts=(\d+)", shown)
    return int(found.group(1)) if found else None


def provenance(device: Any = None, runners: Iterable[str] = ("eager",)) -> dict[str, Any]:
    """Where a sample was timed: host, device, threads, engine (transformers and the models' runners). Samples timed
    differently are never pooled."""
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
        "engine": f"transformers {transformers.__version__} {'+'.join(sorted(runners))}, torch {torch.__version__}",
    }


def weights_versions() -> dict:
    """The library versions a draft's weights depend on (with the thread count, recorded by ``fit``)."""
    import torch
    import transformers

    return {"torch": torch.__version__, "transformers": transformers.__version__}
