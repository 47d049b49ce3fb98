"""The judge of a sandboxed test run: outside the sandbox, as the scorer's own user, it starts the runner
(``sandbox_child.py``) in its sandbox, executes the task's trusted code (the prompt's helpers, then the tests) with
the tested function answered by the runner, and alone decides the verdict, which it prints on its standard output.

Started as ``python -I -S sandbox_judge.py`` with its configuration on standard input; standard library only.
"""

from __future__ import annotations

import builtins
import json
import os
import resource
import sys

if __name__ == "__main__":  # run by path, and ``-I`` leaves its own directory off the path: the wire from there
    sys.path.append(os.path.dirname(os.path.abspath(__file__)))
    from sandbox_child import Channel, decode, describe, encode

    sys.path.pop()
else:
    from .sandbox_child import Channel, decode, describe, encode


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
    sys.set_int_max_str_digits(0)  # the answers' integers, however long
    sys.stdout.write(json.dumps(judge(json.loads(sys.stdin.readline()))) + "\n")


if __name__ == "__main__":
    main()
