"""The model cache (``$SPECENS_CACHE``, default ``~/.cache/specens``), its build lock and its atomic writes."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import shutil
import tempfile
from pathlib import Path

from ..files import open_own, umask
from .spec import ModelError

META = "draft.json"  # the record of a model this project trained (a draft, a student, a feature head)


def cache_dir() -> Path:
    return Path(os.environ.get("SPECENS_CACHE", Path.home() / ".cache" / "specens")).expanduser()


@contextlib.contextmanager
def cache_lock(target: Path):
    """Hold an exclusive lock on ``target`` (a cache entry) while it is built, so parallel jobs build it once."""
    target.parent.mkdir(parents=True, exist_ok=True)
    # a shared cache: a link, a pipe or a hard link planted at the lock's name is refused, never written through
    with open_own(target.parent / f".{target.name}.lock", "a", f"the cache lock of {target.name}") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def save_dir(model, tokenizer, out_dir: Path, files: dict[str, str] | None = None) -> None:
    """A model directory written whole or not at all: the model, its tokenizer and ``files`` (name -> text)."""

    def write(tmp: Path) -> None:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)

    write_dir(out_dir, write, files)


def write_dir(out_dir: Path, write, files: dict[str, str] | None = None) -> None:
    """A directory written whole or not at all: ``write(tmp)`` fills a temporary directory beside it, plus
    ``files`` (name -> text), then it takes ``out_dir``'s place, with the permissions the umask gives a new
    directory (a cache a group shares stays readable to it). Whatever stops the writing (a full disk, an
    interrupt) leaves no temporary directory behind; a full disk is one line (``ModelError``)."""
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}-", dir=out_dir.parent))
    try:
        os.chmod(tmp, 0o777 & ~umask())  # mkdtemp makes 0700, whatever the umask
        write(tmp)
        for name, text in (files or {}).items():
            (tmp / name).write_text(text)
        if out_dir.is_symlink():  # the link goes, never what it points to
            out_dir.unlink()
        elif out_dir.exists():
            shutil.rmtree(out_dir)
        tmp.rename(out_dir)  # atomic: a half-written directory never looks complete
    except BaseException as err:
        shutil.rmtree(tmp, ignore_errors=True)
        if full_disk(err):
            raise ModelError(
                f"{out_dir}: no space left on its device; nothing of it was kept (free some, run again)"
            ) from None
        raise


def full_disk(err: BaseException) -> bool:
    """A write stopped by a full disk or a quota: the OSError, or a library's own error saying so (safetensors
    raises one of its own with the system's message in it)."""
    if isinstance(err, OSError):
        return err.errno in (errno.ENOSPC, errno.EDQUOT)
    return isinstance(err, Exception) and ("No space left on device" in str(err) or "Disk quota exceeded" in str(err))
