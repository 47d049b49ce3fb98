"""Result files written whole or not at all (a temporary file beside them, then a rename) with the permissions the
user's umask gives a new file; user files read with one-line errors (``UserError`` naming the file), a result never
through a symbolic link; JSON read bounded (``parse_json``: nesting and integer length), tensors read without a pickle
(``read_tensors``); JSONL; writable-directory checks; an exclusive lock held by one process at a time; a generated
page's ``main``.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import fcntl
import json
import os
import re
import socket
import stat
import sys
import tempfile
from collections.abc import Callable
from itertools import accumulate
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


MAX_USER_FILE = 2**30  # bytes: a user file larger than this is refused, never read into memory
READ_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC  # a pipe in a file's place must not block the reader
# A file of a results directory (a journal, grid.json, a cell file, a result) is read as itself, never through a
# symbolic link (its last part: ``links=False``, mirroring ``open_own``), so one linked to a file outside the results
# directory is one line and nothing of it is read or copied in. A model's files are followed (``links=True``): a
# Hugging Face cache is made of links.
NO_LINK = os.O_NOFOLLOW


@contextlib.contextmanager
def _user_file(path: Path, what: str, limit: int, links: bool):
    """``path`` opened for reading (a pipe never blocks; ``links`` False: a symbolic link is not followed), once it
    is a regular file of at most ``limit`` bytes; a one-line UserError naming it otherwise, or when it is missing or
    unreadable."""
    try:
        with os.fdopen(os.open(path, READ_FLAGS if links else READ_FLAGS | NO_LINK), "rb") as f:
            info = os.fstat(f.fileno())
            if not stat.S_ISREG(info.st_mode):
                kind = "a directory" if stat.S_ISDIR(info.st_mode) else "not a regular file (a device or a pipe)"
                raise UserError(f"{what} {path} is {kind}; expected a file")
            if info.st_size > limit:
                raise UserError(f"{what} {path} is too large ({info.st_size} bytes; at most {limit} are read)")
            yield f
    except IsADirectoryError:
        raise UserError(f"{what} {path} is a directory; expected a file") from None
    except OSError as err:
        raise _unreadable(path, what, err) from None


def _unreadable(path: Path, what: str, err: OSError) -> UserError:
    """The one line of a file that cannot be opened: a symbolic link (never followed: what it points to, maybe
    outside the results directory, is not read), or the system's reason."""
    if err.errno == errno.ELOOP and os.path.islink(path):
        return UserError(f"{what} {path} is a symbolic link; links are not followed (put the file itself there)")
    return UserError(f"{what} {path}: {err.strerror or type(err).__name__}")


def read_user_bytes(path: Path, what: str = "file", limit: int = MAX_USER_FILE, links: bool = False) -> bytes:
    """The bytes of a file (``what`` it is, for the message), by default one the project keeps (a journal: a
    symbolic link in its place is not followed); a one-line UserError naming it when it is missing, a link, not a
    regular file (a directory, a device, a pipe), unreadable or over ``limit``."""
    with _user_file(Path(path), what, limit, links) as f:
        return f.read()


def user_file(path: Path, what: str = "file", limit: int = MAX_USER_FILE, links: bool = True) -> Path:
    """``path``, checked as ``read_user_bytes`` checks it (a link followed unless ``links`` is False), for a reader
    that takes a path itself (safetensors, torch.load): a pipe or a device in its place is one line, never a wait."""
    with _user_file(Path(path), what, limit, links):
        return Path(path)


def read_tail(path: Path, what: str = "file", size: int = 1 << 16) -> str:
    """The last ``size`` bytes of a plain file as text (a log's cause is at its end: a 1.5 GB log is not read
    whole); a one-line UserError naming it when it is missing, a symbolic link (never followed, as a result is
    not: what it points to, maybe outside the results directory, is not read), not a regular file (a pipe: no
    wait) or unreadable."""
    path = Path(path)
    try:
        with os.fdopen(os.open(path, READ_FLAGS | NO_LINK), "rb") as f:
            info = os.fstat(f.fileno())
            if not stat.S_ISREG(info.st_mode):
                raise UserError(f"{what} {path} is not a regular file (a directory, a device or a pipe)")
            f.seek(max(0, info.st_size - size))
            return f.read(size).decode("utf-8", errors="replace")
    except OSError as err:
        raise _unreadable(path, what, err) from None


def read_user_text(path: Path, what: str = "file", limit: int = MAX_USER_FILE, links: bool = True) -> str:
    """``read_user_bytes`` decoded as UTF-8 (a link followed unless ``links`` is False: a result is read with
    False); a file that is not UTF-8 is a one-line UserError naming it."""
    data = read_user_bytes(path, what, limit, links)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data.count(b"\n", 0, err.start) + 1
        raise UserError(
            f"{what} {path} is not UTF-8 text (byte 0x{data[err.start]:02x} on line {line}); save it as UTF-8"
        ) from None


MAX_JSON_DEPTH = 100  # levels of arrays and objects in a JSON value read: json's parser recurses, the checks too
MAX_JSON_DIGITS = 100  # digits of a JSON integer read (no record holds more than 20): int() refuses past 4,300
_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"', re.S)  # a JSON string, escapes included: its brackets are text
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")
_DIGITS = bytes(48 if 48 <= c <= 57 else 32 for c in range(256))  # an ASCII digit "0", every other byte a space
_STEP = {"[": 1, "{": 1, "]": -1, "}": -1}


class JSONError(UserError, json.JSONDecodeError):
    """JSON that is not read (not JSON, not UTF-8, nested too deep, an integer too long): one line naming where
    it came from. A ``json.JSONDecodeError`` too (``msg``: the reason alone), so a reader that sets a bad line
    aside (a journal's) sets this one aside as well."""

    def __init__(self, where: str, reason: str, doc: str = "", pos: int | None = None):
        json.JSONDecodeError.__init__(self, reason, doc, pos or 0)
        said = reason if pos is None else f"{reason}: line {self.lineno} column {self.colno} (char {pos})"
        self.args, self._made = (f"{where}: {said}",), (where, reason, doc, pos)
        self.syntax = pos is not None  # not JSON at all; else JSON past a bound (depth, digits, a constant)

    def __reduce__(self):  # pickled (to another process) as it was made, not from its one line
        return type(self), self._made


class _LongInteger(Exception):
    def __init__(self, digits: str):
        self.digits = digits


def _integer(digits: str) -> int:
    if len(digits.lstrip("-")) > MAX_JSON_DIGITS:
        raise _LongInteger(digits)
    return int(digits)


def _no_constant(name: str) -> None:
    raise ValueError(f"{name} is not JSON")


def json_depth(text: str) -> int:
    """The deepest nesting of arrays and objects in JSON ``text``, counted without parsing (no recursion)."""
    brackets = _NOT_BRACKET.sub("", _STRING.sub("", text))
    return max(accumulate(map(_STEP.__getitem__, brackets)), default=0)


def parse_json(data: str | bytes, where: str, constants: bool = True) -> Any:
    """The value of JSON ``data`` (bytes: UTF-8, or UTF-16/32 as ``json.loads`` detects it), bounded: at most
    ``MAX_JSON_DEPTH`` levels of nesting and integers of at most ``MAX_JSON_DIGITS`` digits, so no value read makes
    a RecursionError or int()'s ValueError. Anything else (``constants`` False: NaN and Infinity too) is a one-line
    ``JSONError`` naming ``where`` (a file, a line of one, a process); it quotes no more than 20 digits."""
    try:
        text = data.decode(json.detect_encoding(data), "surrogatepass") if isinstance(data, bytes) else data
    except UnicodeDecodeError as err:
        raise JSONError(where, f"not UTF-8 text (byte {err.start})") from None
    if text.count("[") + text.count("{") > MAX_JSON_DEPTH and json_depth(text) > MAX_JSON_DEPTH:
        raise JSONError(where, f"nested deeper than {MAX_JSON_DEPTH} levels (at most {MAX_JSON_DEPTH} are read)")
    hooks: dict[str, Any] = {} if constants else {"parse_constant": _no_constant}
    if b"0" * (MAX_JSON_DIGITS + 1) in text.encode("utf-8", "surrogatepass").translate(_DIGITS):
        hooks["parse_int"] = _integer  # only where a run of digits is as long (an integer maybe): a hook costs time
    try:
        return json.loads(text, **hooks)
    except _LongInteger as err:
        digits = len(err.digits.lstrip("-"))
        raise JSONError(
            where, f"holds an integer of {digits:,} digits ({err.digits[:20]}...; at most {MAX_JSON_DIGITS} are read)"
        ) from None
    except json.JSONDecodeError as err:
        raise JSONError(where, err.msg, err.doc, err.pos) from None
    except (ValueError, RecursionError) as err:  # a constant refused; a depth past the check's (a bug: one line)
        raise JSONError(where, str(err)[:200] or type(err).__name__) from None


def read_user_json(path: Path, what: str = "JSON file", limit: int = MAX_USER_FILE, links: bool = True) -> Any:
    """A JSON file's content (at most ``limit`` bytes, read bounded: ``parse_json``; a link followed unless
    ``links`` is False: a result is read with False); a one-line UserError naming the file (``what`` it is) when it
    cannot be read."""
    return parse_json(read_user_text(Path(path), what, limit, links), f"{what} {path}")


def read_jsonl(path: Path, what: str = "JSONL file", links: bool = True) -> list[dict[str, Any]]:
    """Every record of a JSONL file (blank lines skipped, each read bounded: ``parse_json``; a link followed unless
    ``links`` is False: a result is read with False); a one-line UserError naming the file and line of the first
    record that is not JSON."""
    rows = []
    for n, line in enumerate(read_user_text(path, what, links=links).split("\n"), 1):  # not splitlines: U+2028 is text
        if line.strip():
            try:
                rows.append(parse_json(line, f"{what} {path} line {n}"))
            except JSONError as err:
                raise UserError(f"{what} {path} line {n} is not valid JSON: {err.msg}") from None
    return rows


def read_tensors(path: Path, what: str = "tensor file", limit: int | None = None, mmap: bool = False) -> Any:
    """The tensors (and plain containers of them) a ``torch.save`` file holds, loaded on the CPU by torch's safe
    loader (``weights_only=True``): a pickle of anything else is never run but refused, in one line naming the file
    (``what`` it is), as is a file that is missing, not a regular file, over ``limit`` bytes (None: a cache's own
    file, any size) or damaged."""
    import pickle

    import torch

    user_file(path, what, sys.maxsize if limit is None else limit)  # a pipe in its place: one line, never a wait
    try:
        return torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except pickle.UnpicklingError as err:
        first = (str(err).strip().splitlines() or [""])[0][:160]
        raise UserError(
            f"{what} {path} holds more than tensors, refused unread (torch's safe loader: {first})"
        ) from None
    except Exception as err:  # a damaged file: torch's and zipfile's errors, many kinds, each a multi-line story
        first = (str(err).strip().splitlines() or [""])[0][:160]
        raise UserError(f"{what} {path} cannot be read ({type(err).__name__}: {first})") from None


def open_own(path: Path, mode: str, what: str):
    """Open ``path`` for ``mode`` (``"a"``: append, ``"a+"``: read and append, both creating it) only where it is
    a plain file or absent: never through a symbolic link (``O_NOFOLLOW``), never a directory, a device, a
    pipe (opened without blocking, then checked) or a file of several names (a hard link), so nothing the project
    did not make is written. Anything else
    is a one-line ``ResultsError`` naming the path; the file it points to is left as it was."""
    flags = os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    flags |= os.O_RDWR if mode == "a+" else os.O_WRONLY
    try:
        fd = os.open(path, flags, 0o666)
    except OSError as err:
        kind = {40: "a symbolic link", 21: "a directory", 6: "a pipe with no reader"}.get(err.errno)
        reason = f"it is {kind}" if kind else err.strerror or type(err).__name__
        raise ResultsError(f"cannot write {what} {path}: {reason}; remove it (only plain files are written)") from None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode) or info.st_nlink > 1:  # a hard link writes into another name's file
        os.close(fd)
        kind = "a hard link to another file" if stat.S_ISREG(info.st_mode) else "not a plain file"
        raise ResultsError(f"cannot write {what} {path}: it is {kind}; remove it (only plain files are written)")
    os.set_blocking(fd, True)
    return os.fdopen(fd, mode, encoding="utf-8", errors="replace")  # a damaged file reads, it never raises


class LockHeld(UserError):
    """Another living process holds the lock (one line naming it)."""


@contextlib.contextmanager
def exclusive(path: Path, what: str):
    """Hold an exclusive OS lock (``flock``) on ``path`` for the block, the holder's pid and host written
    into it; released by the OS when the process dies, so a later process takes over a dead holder's lock.
    A lock another living process holds is a one-line ``LockHeld`` naming that process (``what``: the
    thing locked, for the message). The lock file is removed when the block ends."""
    path = Path(path)
    writable_dir(path.parent)
    while True:
        handle = open_own(path, "a+", f"the lock of {what}")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            text = handle.read(200)  # the holder's line; whatever else is there, shown short and printable
            first = (text.splitlines() or [""])[0]
            holder = "".join(c if c.isprintable() else "?" for c in first).strip() or "another process"
            handle.close()
            raise LockHeld(f"{what} is in use by {holder} (lock {path}); wait for it to finish") from None
        try:
            same = os.stat(path).st_ino == os.fstat(handle.fileno()).st_ino
        except FileNotFoundError:
            same = False
        if same:  # not a file the previous holder removed between our open and our lock
            break
        handle.close()
    try:
        handle.seek(0)
        handle.truncate()
        handle.write(f"pid {os.getpid()} on {socket.gethostname()}\n")
        handle.flush()
        yield
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)  # while still held: a waiting process sees another inode and retries
        handle.close()


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


def generated_page(
    argv: list[str] | None, prog: str, doc: str, page: Path, source: str, render: Callable[[], str]
) -> int:
    """The ``main`` of ``python -m <prog> [--check]`` (``doc``: its docstring): write ``page`` as ``render`` makes it
    from ``source``, or with ``--check`` compare and write nothing; 1 when it differs or ``render`` finds a mistake."""
    parser = argparse.ArgumentParser(prog=f"python -m {prog}", description=doc.splitlines()[0])
    parser.add_argument(
        "--check", action="store_true", help=f"compare {page.parent.name}/{page.name} with {source}, write nothing"
    )
    args = parser.parse_args(argv)
    try:
        text = render()
    except UserError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    if args.check:
        if not page.exists() or page.read_text() != text:
            print(f"{page} is out of date ({source} changed): run python -m {prog}", file=sys.stderr)
            return 1
        return 0
    write_atomic(page, text)
    print(page)
    return 0
