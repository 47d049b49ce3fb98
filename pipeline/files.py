"""Result files: atomic writes with ordinary permissions, JSONL reading, writable-directory checks.

Every file a job writes appears whole or not at all (a temporary file beside
it, then a rename) and gets the permissions the user's umask gives a new
file, as if written in place.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

from .errors import UserError


class ResultsError(UserError):
    """A results path that cannot be used (a user-facing, one-line error)."""


def umask() -> int:
    """The process's umask (read without changing it where Linux allows)."""
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


@contextlib.contextmanager
def atomic_path(path: Path):
    """A temporary path beside ``path`` to write to; renamed to ``path`` when the block ends without error."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.stem}-", suffix=path.suffix, dir=path.parent)
    except OSError as err:
        raise _unwritable(path.parent, err) from None
    os.close(fd)
    try:
        yield Path(tmp)
        os.chmod(tmp, 0o666 & ~umask())  # mkstemp makes 0600; a result file is an ordinary file
        os.replace(tmp, path)
        _sync_dir(path.parent)  # the rename itself survives a power loss
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _sync_dir(path: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def write_atomic(path: Path, data: str | bytes) -> None:
    """Write ``data`` (text as UTF-8) to ``path`` atomically, synced to disk before the rename."""
    with atomic_path(Path(path)) as tmp, open(tmp, "wb") as f:
        f.write(data.encode("utf-8") if isinstance(data, str) else data)
        f.flush()
        os.fsync(f.fileno())


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Every record of a JSONL file (blank lines skipped)."""
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def writable_dir(path: Path) -> Path:
    """Make ``path`` (and its parents) and check a file can be created in it; one-line ResultsError if not."""
    path = Path(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".write-check-", dir=path)
        os.close(fd)
        os.unlink(probe)
    except OSError as err:
        raise _unwritable(path, err) from None
    return path


def _unwritable(path: Path, err: OSError) -> ResultsError:
    reason = "Not a directory" if path.exists() and not path.is_dir() else err.strerror or type(err).__name__
    return ResultsError(f"cannot write to directory {path}: {reason}; choose a writable location")
