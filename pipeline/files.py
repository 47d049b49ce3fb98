"""Result files written whole or not at all (a temporary file beside them, then a rename) with the permissions the
user's umask gives a new file; user files read with one-line errors (``UserError`` naming the file); JSONL;
writable-directory checks; an exclusive lock held by one process at a time; a generated page's ``main``.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import socket
import stat
import sys
import tempfile
from collections.abc import Callable
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


@contextlib.contextmanager
def _user_file(path: Path, what: str, limit: int):
    """``path`` opened for reading (a pipe never blocks), once it is a regular file of at most ``limit`` bytes;
    a one-line UserError naming it otherwise, or when it is missing or unreadable."""
    try:
        with os.fdopen(os.open(path, os.O_RDONLY | os.O_NONBLOCK), "rb") as f:  # a pipe must not block
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
        raise UserError(f"{what} {path}: {err.strerror or type(err).__name__}") from None


def read_user_bytes(path: Path, what: str = "file", limit: int = MAX_USER_FILE) -> bytes:
    """The bytes of a file the user gave (``what`` it is, for the message); a one-line UserError naming it
    when it is missing, not a regular file (a directory, a device, a pipe), unreadable or over ``limit``."""
    with _user_file(Path(path), what, limit) as f:
        return f.read()


def user_file(path: Path, what: str = "file", limit: int = MAX_USER_FILE) -> Path:
    """``path``, checked as ``read_user_bytes`` checks it, for a reader that takes a path itself (safetensors,
    torch.load): a pipe or a device in its place is one line, never a wait."""
    with _user_file(Path(path), what, limit):
        return Path(path)


def read_tail(path: Path, what: str = "file", size: int = 1 << 16) -> str:
    """The last ``size`` bytes of a plain file as text (a log's cause is at its end: a 1.5 GB log is not read
    whole); a one-line UserError naming it when it is missing, not a regular file (a pipe: no wait) or unreadable."""
    path = Path(path)
    try:
        with os.fdopen(os.open(path, os.O_RDONLY | os.O_NONBLOCK), "rb") as f:
            info = os.fstat(f.fileno())
            if not stat.S_ISREG(info.st_mode):
                raise UserError(f"{what} {path} is not a regular file (a directory, a device or a pipe)")
            f.seek(max(0, info.st_size - size))
            return f.read(size).decode("utf-8", errors="replace")
    except OSError as err:
        raise UserError(f"{what} {path}: {err.strerror or type(err).__name__}") from None


def read_user_text(path: Path, what: str = "file", limit: int = MAX_USER_FILE) -> str:
    """``read_user_bytes`` decoded as UTF-8; a file that is not UTF-8 is a one-line UserError naming it."""
    data = read_user_bytes(path, what, limit)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data.count(b"\n", 0, err.start) + 1
        raise UserError(
            f"{what} {path} is not UTF-8 text (byte 0x{data[err.start]:02x} on line {line}); save it as UTF-8"
        ) from None


def read_user_json(path: Path, what: str = "JSON file", limit: int = MAX_USER_FILE) -> Any:
    """A JSON file's content (at most ``limit`` bytes); a one-line UserError naming the file (``what`` it is) when
    it cannot be read."""
    try:
        return json.loads(read_user_text(Path(path), what, limit))
    except json.JSONDecodeError as err:
        raise UserError(f"{what} {path}: {err}") from None


def read_jsonl(path: Path, what: str = "JSONL file") -> list[dict[str, Any]]:
    """Every record of a JSONL file (blank lines skipped); a one-line UserError naming the file and line
    of the first record that is not JSON."""
    rows = []
    for n, line in enumerate(read_user_text(path, what).split("\n"), 1):  # not splitlines: U+2028 is text
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as err:
                raise UserError(f"{what} {path} line {n} is not valid JSON: {err.msg}") from None
    return rows


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


def schema_validator(schema: dict[str, Any]):
    """A JSON Schema's validator for what a user gives, with "integer" meaning a real int (JSON Schema alone
    accepts 4.0 and True): the config's schema and a model's config.json (``records.CONFIG_JSON``)."""
    import jsonschema

    cls = jsonschema.validators.validator_for(schema)
    checker = cls.TYPE_CHECKER.redefine("integer", lambda _, x: isinstance(x, int) and not isinstance(x, bool))
    return jsonschema.validators.extend(cls, type_checker=checker)(schema)


def shown_key(part: Any) -> str:
    """A key of a path into a record as one line shows it: as it is, or escaped (JSON's escapes, quoted) where it
    holds a character that is not printable, such as a newline."""
    text = str(part)
    return text if text.isprintable() else json.dumps(text)


def schema_problems(schema: dict[str, Any], value: Any, where: str) -> list[str]:
    """One line per part of ``value`` that ``schema`` does not accept, naming ``where`` (a file, a line), the key,
    the value (shortened) and what is accepted (a subschema's ``accepted`` where it says it in words)."""
    lines = []
    for error in sorted(schema_validator(schema).iter_errors(value), key=lambda e: list(map(str, e.absolute_path))):
        key = ".".join(map(shown_key, error.absolute_path)) or "(top level)"
        shown = json.dumps(error.instance, default=str)
        shown = shown if len(shown) <= 40 else shown[:37] + "..."
        if error.validator == "required":
            lines.append(f"{where}: {error.message}")
        else:
            said = error.schema.get("accepted") if isinstance(error.schema, dict) else None  # the schema's words
            lines.append(f"{where}: {key}={shown} is not accepted ({said or error.message.split(' is ')[-1][:80]})")
    return lines


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
