"""The sandbox contains hostile completions: each one fails, within its limits, and harms nothing."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path

import pytest

from tasks.sandbox import _sandbox_root, run_python

IS_ROOT = os.geteuid() == 0


@pytest.fixture()
def canaries(tmp_path):
    """One canary under /tmp and one beside the sandbox's own directories."""
    outside = Path(tempfile.mkdtemp(prefix="canary-", dir=Path(_sandbox_root()).parent))
    dirs = [tmp_path / "canary", outside]
    for d in dirs:
        d.mkdir(exist_ok=True)
        (d / "keep").write_text("x")
    yield dirs
    for d in dirs:
        assert (d / "keep").read_text() == "x", f"canary {d} was harmed"
    shutil.rmtree(outside, ignore_errors=True)


def battery(canaries: list[Path], escape: Path) -> dict[str, str]:
    rm = "".join(f"os.system('rm -rf {c}')\nshutil.rmtree('{c}', ignore_errors=True)\n" for c in canaries)
    return {
        "infinite loop": "while True:\n    pass\n",
        "fork bomb": "import os\nwhile True:\n    os.fork()\n",
        "memory bomb": "x = bytearray(16 * 1024**3)\n",
        "rm -rf a canary": f"import os, shutil\n{rm}",
        "write outside": f"open('{escape}', 'w').write('escaped')\n",
        "socket to localhost": "import socket\ns = socket.socket()\ns.connect(('127.0.0.1', 22))\n",
        "exit before asserts": "import sys\nsys.exit(0)\nassert False\n",
        "os._exit before asserts": "import os\nos._exit(0)\nassert False\n",
        "patched failure hooks": "import sys, builtins\nsys.excepthook = lambda *a: None\n"
        "builtins.AssertionError = type('X', (Exception,), {})\nassert 1 == 2\n",
    }


OS_LEVEL = {  # bypass the interpreter guard: only the operating system's walls are left
    "ctypes unlink": "import ctypes\nfor c in {canaries!r}:\n    ctypes.CDLL(None).unlink((c + '/keep').encode())\n",
    "ctypes system": "import ctypes\nfor c in {canaries!r}:\n    ctypes.CDLL(None).system(('rm -rf ' + c).encode())\n"
    "ctypes.CDLL(None).system(b'echo x > {escape}')\n",
    "ctypes fork bomb": "import ctypes\nlibc = ctypes.CDLL(None)\nwhile True:\n    libc.fork()\n",
}


@pytest.mark.parametrize("isolate", [True, False], ids=["isolated", "guard-only"])
def test_hostile_battery(canaries, tmp_path, isolate):
    escape = tmp_path / "escaped.txt"
    for name, program in battery(canaries, escape).items():
        start = time.perf_counter()
        result = run_python(program, timeout_s=3, memory_mb=512, isolate=isolate)
        assert not result.passed, name
        assert time.perf_counter() - start < 8, f"{name} outlived its limits"
    assert not escape.exists()


@pytest.mark.skipif(not IS_ROOT, reason="namespaces and a dropped uid need root")
def test_os_level_walls_hold_without_the_guard(canaries, tmp_path):
    escape = tmp_path / "escaped.txt"
    for name, template in OS_LEVEL.items():
        program = template.format(canaries=[str(c) for c in canaries], escape=escape)
        start = time.perf_counter()
        run_python(program, timeout_s=3)
        assert time.perf_counter() - start < 8, name
    assert not escape.exists()


def test_ordinary_programs_run():
    ok = run_python("import math, typing, collections\nopen('scratch', 'w').write('x')\nassert math.gcd(4, 6) == 2\n")
    assert ok.passed, ok.detail
    failed = run_python("def f():\n    return 1\nassert f() == 2, 'wrong'\n")
    assert not failed.passed and "AssertionError: wrong" in failed.detail
