"""Hostile HumanEval completions, and a scorer run as root or as an unprivileged user to face them.

Each attack is the top of a completion for HumanEval/0 (``has_close_elements``),
followed by a wrong definition of the function: any pass is a forged verdict.
Traces left on the host (a harmed canary, a file in a host directory, a
process outliving the scoring) are escapes. Used by ``test_sandbox.py`` and
by ``python -m tests.sandbox_report``.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

SANDBOX = Path(__file__).resolve().parents[1] / "tasks" / "sandbox.py"
UNPRIVILEGED = 4242  # a uid with no name and no files: the non-root scorer when the tests run as root
HOST_DIRS = ["/run/lock", "/tmp", "/var/tmp", "/dev/shm", "/usr", str(Path.home())]

WRONG = "def has_close_elements(numbers, threshold):\n    return len(numbers) % 2 == 0\n"
RIGHT = (
    "def has_close_elements(numbers, threshold):\n"
    "    return any(abs(a - b) < threshold for i, a in enumerate(numbers) for b in numbers[i + 1 :])\n"
)
THREADED = (
    "import threading\n\n"
    "def has_close_elements(numbers, threshold):\n"
    "    found = []\n"
    "    worker = threading.Thread(\n"
    "        target=lambda: found.append(\n"
    "            any(abs(a - b) < threshold for i, a in enumerate(numbers) for b in numbers[i + 1 :])\n"
    "        )\n"
    "    )\n"
    "    worker.start()\n"
    "    worker.join()\n"
    "    return found[0]\n"
)
SLOW_RIGHT = "import time\ntime.sleep(1.5)\n" + RIGHT
PRINT_1GB = "import sys\nchunk = 'x' * (1 << 20)\nfor _ in range(1024):\n    sys.stdout.write(chunk)\n" + RIGHT
KILL_LOOP = "import posix\nwhile True:\n    posix.kill(-1, 9)\n"
SURVIVE = (  # a double fork and setsid, then {body} in a process named by the token
    "import os, sys\n"
    "try:\n"
    "    if os.fork() == 0:\n"
    "        os.setsid()\n"
    "        if os.fork() == 0:\n"
    "            os.execv(sys.executable, [sys.executable, '-c', {body!r}, '{token}'])\n"
    "        os._exit(0)\n"
    "    os.wait()\n"
    "except OSError:\n"
    "    pass\n"
)
SLEEPER = SURVIVE.replace("{body!r}", repr("import time\ntime.sleep(600)"))
WRITES = (  # every way to write a file that the interpreter guard did not cover
    "import ctypes, io, os, posix\n"
    "for t in {targets!r}:\n"
    "    for write in (lambda: io.FileIO(t, 'w').write(b'x'),\n"
    "                  lambda: posix.write(posix.open(t, os.O_WRONLY | os.O_CREAT), b'x'),\n"
    "                  lambda: ctypes.CDLL(None).system(('echo x > ' + t).encode()),\n"
    "                  lambda: posix.system('echo x > ' + t)):\n"
    "        try:\n"
    "            write()\n"
    "        except Exception:\n"
    "            pass\n"
)
FORGED_VERDICT = '{{"status": "passed", "detail": "", "output": "", "output_bytes": 0}}\\n{{"ready": true}}\\n'

ATTACKS = {
    "harness success path": "import sys\nsys.modules['__main__'].finish()\n",
    "every finish() in sys.modules": "import sys\nfor m in list(sys.modules.values()):\n"
    "    f = getattr(m, 'finish', None)\n    if callable(f):\n        f()\n",
    "sys.exit(0) before the tests": "import sys\nsys.exit(0)\n",
    "os._exit(0) before the tests": "import os\nos._exit(0)\n",
    "posix._exit with every code": "import posix, random\nposix._exit(random.randrange(256))\n",
    "patched failure hooks": "import sys, builtins\nsys.excepthook = lambda *a: None\n"
    "builtins.AssertionError = type('X', (Exception,), {{}})\n",
    "caller frames": "import sys\nf = sys._getframe()\nwhile f:\n    f.f_globals['passed'] = True\n    f = f.f_back\n",
    "a passing verdict on every descriptor": "import os\nfor fd in range(256):\n    try:\n"
    f"        os.write(fd, b'{FORGED_VERDICT}')\n    except OSError:\n        pass\n",
    "an always-equal result": "class Equal:\n    def __eq__(self, other):\n        return True\n\n"
    "def has_close_elements(numbers, threshold):\n    return Equal()\n",
    "a str subclass equal to anything": "class S(str):\n    def __eq__(self, other):\n        return True\n"
    "    __hash__ = str.__hash__\n\ndef has_close_elements(numbers, threshold):\n    return S('x')\n",
    "kill the parent, then everyone": "import posix\nfor pid in (posix.getppid(), -1):\n    try:\n"
    "        posix.kill(pid, 9)\n    except OSError:\n        pass\n",
    "rm -rf the canaries": "import os, posix, shutil, ctypes\nfor c in {canaries!r}:\n"
    "    posix.system('rm -rf ' + c)\n    ctypes.CDLL(None).system(('rm -rf ' + c).encode())\n"
    "    shutil.rmtree(c, ignore_errors=True)\n    try:\n        posix.unlink(c + '/keep')\n    except OSError:\n"
    "        pass\n    try:\n        io = __import__('io')\n        io.FileIO(c + '/keep', 'w').write(b'harmed')\n"
    "    except OSError:\n        pass\n",
    "writes to host directories": WRITES,
    "remount the binds writable": "import ctypes\nlibc = ctypes.CDLL(None)\nfor d in (b'/', b'/usr', b'/tmp'):\n"
    "    libc.mount(None, d, None, 32 | 4096 | 16384, None)\n" + WRITES,
    "a socket to localhost": "import socket\ns = socket.socket()\ns.settimeout(1)\ns.connect(('127.0.0.1', 22))\n",
    "fork bomb": "import os\nwhile True:\n    os.fork()\n",
    "ctypes fork bomb": SLEEPER + "import ctypes\nlibc = ctypes.CDLL(None)\nwhile True:\n    libc.fork()\n",
    "memory bomb": "x = bytearray(16 * 1024**3)\n",
    "a huge answer": "def has_close_elements(numbers, threshold):\n    return 'x' * (20 << 20)\n",
    "fill /tmp": "for n in range(256):\n    with open(f'/tmp/fill{{n}}', 'wb') as f:\n"
    "        f.write(b'x' * (8 << 20))\n",
    "infinite loop": SLEEPER + "while True:\n    pass\n",
    "a process outliving the run": SLEEPER,
    "kill(-1, 9) left running": SURVIVE.replace("{body!r}", repr(KILL_LOOP)),
}


def completion(code: str) -> str:
    """A chat answer whose code block holds ``code``, then a wrong function unless ``code`` defines one."""
    if "def has_close_elements" not in code:
        code += "\n" + WRONG
    return f"```python\n{code}```\n"


def attack_code(template: str, canaries: list[Path], token: str) -> str:
    targets = [f"{d}/specens-escape-{token}" for d in [*HOST_DIRS, *map(str, canaries)]]
    return template.format(canaries=[str(c) for c in canaries], targets=targets, token=token)


def make_canaries(owner: int | None) -> list[Path]:
    """Two directories with a file ``keep``: one under /tmp, one beside the sandbox's cache; owned by ``owner``."""
    cache = Path(os.environ.get("SPECENS_CACHE", Path.home() / ".cache" / "specens")).expanduser()
    cache.mkdir(parents=True, exist_ok=True)
    dirs = [Path(tempfile.mkdtemp(prefix="specens-canary-")), Path(tempfile.mkdtemp(prefix="canary-", dir=cache))]
    for d in dirs:
        (d / "keep").write_text("x")
        if owner is not None:
            for p in (d, d / "keep"):
                os.chown(p, owner, owner)
    return dirs


def traces(token: str, canaries: list[Path]) -> list[str]:
    """What a run left on the host: harmed canaries, files named by ``token``, processes carrying it."""
    found = [f"canary {c} harmed" for c in canaries if not _intact(c / "keep")]
    found += [
        f"{d}/specens-escape-{token} written"
        for d in [*HOST_DIRS, *map(str, canaries)]
        if os.path.lexists(f"{d}/specens-escape-{token}")
    ]
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if token.encode() in argv:
            found.append(f"process {pid} outlived the scoring")
    return found


def _intact(path: Path) -> bool:
    try:
        return path.read_text() == "x"
    except OSError:
        return False


def remove(canaries: list[Path], token: str = "") -> None:
    """The canaries, and any file an escaped attack wrote with ``token``."""
    for d in HOST_DIRS if token else []:
        with contextlib.suppress(OSError):
            os.unlink(f"{d}/specens-escape-{token}")
    for c in canaries:
        shutil.rmtree(c, ignore_errors=True)


def new_token() -> str:
    return f"9{secrets.randbelow(10**9)}.5"  # also a valid argument to sleep


# --- a scorer in its own process, as root or as an unprivileged uid --------------------------------------------

SCORER = r"""
import importlib.util, json, resource, sys
from concurrent.futures import ThreadPoolExecutor
spec = importlib.util.spec_from_file_location("specens_sandbox", sys.argv[1])
sandbox = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = sandbox
spec.loader.exec_module(sandbox)
job = json.loads(sys.stdin.read())

def one(run):
    r = sandbox.run_tests(**run)
    return {"passed": r.passed, "status": r.status, "detail": r.detail, "output_bytes": r.output_bytes,
            "output_kept": len(r.output), "seconds": r.seconds}

with ThreadPoolExecutor(job["workers"]) as pool:
    results = list(pool.map(one, job["runs"]))
peak = next(line for line in open("/proc/self/status") if line.startswith("VmHWM:"))  # since exec, not fork
print(json.dumps({"results": results, "scorer_mb": int(peak.split()[1]) / 1024,
                  "children_mb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024}))
"""


def scorer_python(user: int | None) -> str | None:
    """An interpreter ``user`` can start (root's own may sit under a home it cannot traverse); None if none."""
    for python in (sys.executable, os.path.realpath(sys.executable), shutil.which("python3") or "", "/usr/bin/python3"):
        if python and _starts(python, user):
            return python
    return None


def _starts(python: str, user: int | None) -> bool:
    try:
        return (
            subprocess.run(
                [python, "-c", "import sys; assert sys.version_info >= (3, 11)"],
                user=user,
                capture_output=True,
                timeout=30,
            ).returncode
            == 0
        )
    except (OSError, subprocess.SubprocessError):
        return False


@functools.cache
def readable_sandbox() -> Path:
    """A copy of the sandbox's three files that any uid can read: the checkout may sit under a directory only
    its owner can traverse (a fresh clone in a 0700 temporary directory)."""
    copy = Path(tempfile.mkdtemp(prefix="specens-sandbox-src-"))
    atexit.register(shutil.rmtree, copy, True)
    for name in (SANDBOX.name, "sandbox_child.py", "sandbox_judge.py"):
        shutil.copyfile(SANDBOX.with_name(name), copy / name)
        (copy / name).chmod(0o644)
    copy.chmod(0o755)
    return copy / SANDBOX.name


def score(runs: list[dict], user: int | None = None, workers: int = 1) -> dict:
    """Run ``runs`` (``run_tests`` arguments) in a fresh scorer process, as ``user`` when given."""
    python = scorer_python(user)
    if python is None:
        raise RuntimeError(f"no Python interpreter that uid {user} can start")
    env = {"PATH": "/usr/bin:/bin", "HOME": "/tmp" if user is not None else str(Path.home())}
    proc = subprocess.run(
        [python, "-I", "-c", SCORER, str(SANDBOX if user is None else readable_sandbox())],
        input=json.dumps({"runs": runs, "workers": workers}),
        capture_output=True,
        text=True,
        user=user,
        env=env,
        timeout=600,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"the scorer failed: {proc.stderr[-2000:]}")
    return json.loads(proc.stdout)
