"""The model cache (``$SPECENS_CACHE``, default ``~/.cache/specens``) and its build lock."""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path


def cache_dir() -> Path:
    return Path(os.environ.get("SPECENS_CACHE", Path.home() / ".cache" / "specens")).expanduser()


@contextlib.contextmanager
def cache_lock(target: Path):
    """Hold an exclusive lock on ``target`` (a cache entry) while it is built, so parallel jobs build it once."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f".{target.name}.lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
