"""The generation journal: one JSON line per sample, appended and synced as samples are made.

A job that dies resumes from it; recovery judges every line on its own, keeps good samples byte for byte and
moves any other line to ``<journal>.rejected`` with its reason (docs/workflow.md: what a line must be).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from ..files import (
    JSONError,
    ResultsError,
    exclusive,
    open_own,
    parse_json,
    read_user_bytes,
    writable_dir,
    write_atomic,
)

Check = Callable[[dict[str, Any]], str | None]  # a sample's problem in words, or None when it is valid


def journal_lock(path: Path):
    """One job per journal at a time (``files.exclusive`` on ``<journal>.lock``): a second job on a cell being
    generated stops at once with one line naming the first; a job whose holder died takes over and resumes."""
    return exclusive(Path(f"{path}.lock"), f"the cell journal {path}")


class Journal:
    def __init__(self, path: Path, ids: Iterable[str], check: Check):
        self.path = Path(path)
        self.ids = list(ids)
        self._known = set(self.ids)
        self.check = check
        self.rejected = Path(f"{self.path}.rejected")
        self.rows: dict[str, dict[str, Any]] = {}  # the good samples of the last recovery, as read
        writable_dir(self.path.parent)

    def _judge(self, line: bytes, seen: dict[str, bytes], torn: bool) -> tuple[str | None, str | None]:
        """(id, None) for a good sample, (None, reason) for a line to reject."""
        try:
            row = parse_json(line, f"the journal {self.path}")  # bounded: too deep, too long a number
        except (UnicodeDecodeError, json.JSONDecodeError) as err:
            bounded = isinstance(err, JSONError) and not err.syntax  # JSON, past the reader's bounds
            return None, "a line torn by a crash mid-write" if torn else err.msg if bounded else "not valid JSON"
        if not isinstance(row, dict):
            return None, f"a JSON {type(row).__name__}, not an object"
        sample_id = row.get("id")
        if not isinstance(sample_id, str):
            return None, "no string 'id'"
        if sample_id not in self._known:
            return None, f"id {sample_id!r} is not an example of this cell"
        if sample_id in seen:
            return None, f"a second line for id {sample_id!r} (the first is kept)"
        if problem := self.check(row):
            return None, problem
        self.rows[sample_id] = row
        return sample_id, None

    def recover(self) -> dict[str, bytes]:
        """The good samples by id (each line's bytes, without its newline); the journal is repaired in place."""
        self.rows = {}
        if not self.path.exists():
            return {}
        data = read_user_bytes(self.path, "the journal")  # a pipe, a device, a link to one: one line, no wait
        lines = data.split(b"\n")
        unterminated = not data.endswith(b"\n") and data != b""
        if not unterminated:
            lines.pop()  # the empty piece after the final newline
        kept: dict[str, bytes] = {}
        rejects: list[tuple[int, bytes, str]] = []
        blank = False
        for n, line in enumerate(lines, 1):
            if not line.strip():
                blank = True
                continue
            sample_id, reason = self._judge(line, kept, torn=unterminated and n == len(lines))
            if sample_id is None:
                rejects.append((n, line, reason or "invalid"))
            else:
                kept[sample_id] = line
        if rejects or unterminated or blank:
            self._set_aside(rejects)
            write_atomic(self.path, b"".join(line + b"\n" for line in kept.values()))
        return kept

    def refuse(self, kept: dict[str, bytes], check: Check) -> dict[str, bytes]:
        """``kept`` (``recover``'s samples, the journal as it left it) less the lines ``check`` refuses once the job
        can judge a line as a sample of its own (its models loaded: token ids of their vocabulary, an output that
        is the ids' text): each moved to ``<journal>.rejected`` with one warning line, its prompt generated again."""
        order = list(kept)
        rejects = [
            (n, kept[i], f"{why}; its prompt is generated again")
            for n, i in enumerate(order, 1)
            if (why := check(self.rows[i]))
        ]
        if not rejects:
            return kept
        refused = {order[n - 1] for n, _, _ in rejects}
        self._set_aside(rejects)
        left = {i: line for i, line in kept.items() if i not in refused}
        write_atomic(self.path, b"".join(line + b"\n" for line in left.values()))
        return left

    def _set_aside(self, rejects: list[tuple[int, bytes, str]]) -> None:
        if not rejects:
            return
        records = [
            {"journal": str(self.path), "line": n, "reason": reason, "raw": raw.decode("utf-8", "surrogateescape")}
            for n, raw, reason in rejects
        ]
        try:
            with open_own(self.rejected, "a", "the journal's set-aside records") as f:
                f.write("".join(json.dumps(r) + "\n" for r in records))
                f.flush()
                os.fsync(f.fileno())
        except OSError as err:
            raise ResultsError(f"cannot write {self.rejected}: {err.strerror}; nothing was changed") from None
        for n, _, reason in rejects:
            print(f"warning: {self.path} line {n}: {reason}; moved to {self.rejected}", file=sys.stderr, flush=True)

    @contextlib.contextmanager
    def writer(self):
        """A function that appends one sample to the journal and syncs it to disk."""
        f = open_own(self.path, "a", "the journal")  # never through a link: one line instead

        def add(row: dict[str, Any]) -> None:
            try:
                f.write(json.dumps(row) + "\n")
                f.flush()
                os.fsync(f.fileno())
            except OSError as err:  # a full disk, a quota: the samples before this one are kept, the next run resumes
                with contextlib.suppress(OSError):  # closed now, its unwritten line dropped: closing on the way
                    f.close()  # out would try the full disk again and raise its OSError in place of this line
                raise ResultsError(
                    f"cannot write the journal {self.path}: {err.strerror or type(err).__name__}; the samples "
                    "already written are kept and the next run resumes from them"
                ) from None

        with f:
            yield add

    def finish(self, out: Path) -> list[dict[str, Any]]:
        """Write every sample to ``out`` in the task's order (atomically); return them. The journal stays."""
        kept = self.recover()
        if missing := [i for i in self.ids if i not in kept]:
            raise ResultsError(f"{self.path}: {len(missing)} samples missing (first: {missing[0]!r})")
        ordered = [kept[i] for i in self.ids]
        write_atomic(out, b"".join(line + b"\n" for line in ordered))
        return [parse_json(line, f"the journal {self.path}") for line in ordered]
