"""Where an experiment stands, from its results directory alone: ``pipeline status RESULTS`` and
``pipeline rerun RESULTS --unstable``.

A cell is *done* when it is judged and scored (``.speed.json``, ``.summary.json``); *running* when its
generation's journal exists without the final ``.jsonl``, or a step's log exists, its output does not, and
the log ends without an error; *failed* when a step's log ends in an error and its output is missing (the
cause: the log's error line); *pending* otherwise. A cell whose speed judge raised flags is *unstable*
(done, but measured under interference or with too wide an interval; ``rerun_unstable`` sets them aside).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import UserError
from ..experiment.cell import GRID
from ..experiment.paths import CELL_FILES, Results, cell_path
from ..files import read_tail, read_user_json
from ..measure.speed import SPEED_RECORD
from ..records import read_record

SPEED_LIMIT = 1 << 24  # bytes: a speed record is a few kilobytes

# a cell's steps in order: the rule's log directory and the file its success leaves
STEPS = (("generate", "samples"), ("derive", "samples"), ("speed", "speed"), ("score", "summary"), ("wandb", "wandb"))
ERROR_LINE = re.compile(r"^(error\b|[\w.]*(Error|Exception)\b|Killed|Traceback)|\bout of memory\b", re.I)


@dataclass
class Status:
    done: list[str] = field(default_factory=list)
    running: list[str] = field(default_factory=list)
    pending: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)  # cell (or "model <name>") -> its one-line cause
    unstable: dict[str, str] = field(default_factory=dict)  # cell -> its flags


CAUSE_SEARCH = (1 << 16, 1 << 26)  # bytes from a log's end searched for its cause: its end, then its last 64 MiB


def cause(log: Path) -> str | None:
    """The one-line cause a failed job's log gives: its last error line (None when it names no error). Its end is
    read first; where that names none, its last 64 MiB (a job that printed much after its error is still failed,
    and a 1.5 GB log is still not read whole)."""
    for size in CAUSE_SEARCH:
        try:
            text = read_tail(log, "log", size)
        except UserError:  # gone, a pipe, unreadable: it names no cause
            return None
        lines = [line.strip() for line in text.splitlines() if line.strip()]
        if found := next((line[:300] for line in reversed(lines) if ERROR_LINE.search(line)), None):
            return found
        if len(text.encode("utf-8", errors="replace")) < size:  # the whole log was read
            return None
    return None


def cell_ids(results: Path) -> list[str]:
    """The cells of a results directory, from its index (grid.json, written by the workflow)."""
    index = Results(results).grid
    try:
        ids = [dims["id"] for dims in read_record(index, GRID, "the index")]  # a pipe: one line, no wait
    except UserError as err:
        said = str(err).removeprefix(f"the index {index}").lstrip(": ")
        raise UserError(f"results directory {results}: no readable grid.json ({said[:160]})") from None
    for cell in ids:
        parts = Path(cell).parts if isinstance(cell, str) else ()
        if not parts or Path(cell).is_absolute() or ".." in parts or "\0" in cell or cell != Path(cell).as_posix():
            shown = repr(cell) if len(repr(cell)) <= 80 else repr(cell)[:77] + "..."
            raise UserError(
                f"{index}: cell id {shown} is not a path inside the results directory (expected names such as "
                "humaneval/pair/sd-T0-g2); the file is not the workflow's"
            )
    return ids


def flags(speed: Path) -> list[str]:
    """The speed judge's flags of a cell (empty when it has none or is not judged yet). A ``.speed.json`` that
    is there but is no speed record (damaged, not JSON, not an object) is a flag of its own: its cell cannot be
    trusted until judged again (``rerun --unstable`` sets it aside)."""
    if not speed.exists():
        return []
    try:
        record = read_record(speed, SPEED_RECORD, limit=SPEED_LIMIT)
    except UserError as err:  # a pipe, a device, too large, unreadable, not JSON, not a speed record
        said = str(err).removeprefix(f"speed record {speed}").lstrip(": ")
        return [f"{speed.name} cannot be read ({said[:160]}); judge the cell again"]
    return [str(f) for f in record.get("flags") or []]


def model_failures(results: Path) -> dict[str, str]:
    """``model <name>`` -> cause, for each model whose fetch or preparation failed."""
    failed = {}
    files = Results(results)
    for log in sorted((files.logs / "prepare").glob("*.log")):
        name = log.name.removesuffix(".log").removesuffix(".fetch")
        if not files.model(name).exists() and (why := cause(log)):
            failed.setdefault(f"model {name}", why)
    return failed


def status(results: Path) -> Status:
    results = Path(results)
    files = Results(results)
    out = Status(failed=model_failures(results))
    for cell in cell_ids(results):
        if found := flags(cell_path(results, cell, "speed")):
            out.unstable[cell] = "; ".join(found)
        journal = files.journal(str(Path(cell).parent)).glob(f"{Path(cell).name}-*.jsonl")
        state = "running" if any(journal) else "pending"
        for step, made in STEPS:  # the first step without its output and with a log tells where the cell is
            log = files.log(step, cell)
            if cell_path(results, cell, made).exists() or not log.exists():
                continue
            rivals = [files.log(other, cell) for other, out in STEPS if out == made and other != step]
            if any(r.exists() and r.stat().st_mtime > log.stat().st_mtime for r in rivals):
                continue  # an earlier job's log for the same file (a cell generated once, derived since)
            if why := cause(log):
                out.failed[cell] = f"{step}: {why}"
                state = "failed"
            else:
                state = "running"
            break
        if state == "failed":
            continue
        if all(cell_path(results, cell, kind).exists() for kind in ("speed", "summary")):
            state = "done"
        getattr(out, state).append(cell)
    return out


def failure_lines(results: Path) -> list[str]:
    """One line per failed model or cell (``model <name>: <cause>``, ``cell <id>: <step>: <cause>``): what the
    workflow prints when it fails."""
    try:
        failed = status(results).failed
    except UserError:  # before the grid was written: the models only
        failed = model_failures(Path(results))
    return [f"{name if name.startswith('model ') else 'cell ' + name}: {why}" for name, why in failed.items()]


def report(results: Path) -> str:
    """``pipeline status``: counts, then each failed cell with its cause and each unstable cell with its flags."""
    s = status(results)
    cells = len(s.done) + len(s.running) + len(s.pending) + len([c for c in s.failed if not c.startswith("model ")])
    lines = [
        f"{cells} cells: {len(s.done)} done, {len(s.running)} running, {len(s.failed)} failed, "
        f"{len(s.pending)} pending; {len(s.unstable)} flagged unstable"
    ]
    lines += [f"failed  {name}: {why}" for name, why in s.failed.items()]
    lines += [f"running {cell}" for cell in s.running]
    lines += [f"unstable {cell}: {why}" for cell, why in s.unstable.items()]
    if s.unstable:
        lines.append(f"to measure the unstable cells again: pipeline rerun {results} --unstable, then the workflow")
    return "\n".join(lines)


def _samples_from(results: Path, cell: str, cells: set[str]) -> str | None:
    """The cell whose side-by-side runs are ``cell``'s samples (its cell file's ``samples_from``), if any: one of
    ``cells`` (the results directory's own), else a one-line UserError; a cell file not yet written names none."""
    path = Results(results).cell_file(cell)
    if not path.exists():
        return None
    data = read_user_json(path, "cell file", links=False)
    dims = data.get("dims") if isinstance(data, dict) else None
    source = dims.get("samples_from") if isinstance(dims, dict) else None
    if not isinstance(data, dict) or not isinstance(dims, dict | None):
        raise UserError(
            f"cell file {path} is not a cell file (a JSON object with a cell and its dims); nothing was moved"
        )
    if source is not None and source not in cells:
        raise UserError(
            f"cell file {path}: samples_from {json.dumps(source)[:80]} is not a cell of {results}; nothing was moved"
        )
    return source


def rerun_unstable(results: Path) -> list[str]:
    """Move the flagged cells' files (generations, judgements, scores, W&B records, logs) under
    ``RESULTS/rerun/<time>/``, with the aggregate tables they were in; the workflow then runs those cells and
    the aggregate steps again, and nothing else. Returns the cells.

    All or none: every directory a file leaves or enters is checked writable before anything moves, a move
    across filesystems copies then deletes (``shutil.move``), and a move that fails puts back every file
    already moved before its one-line ``UserError``: a cell is never left half set aside."""
    results = Path(results)
    flagged = list(status(results).unstable)
    ids = cell_ids(results)
    sources = {c: _samples_from(results, c, set(ids)) for c in ids}
    for cell in list(flagged):  # a cell derived from another's side-by-side runs is measured again by that one
        if sources.get(cell) and sources[cell] not in flagged:
            flagged.append(sources[cell])
    flagged += [c for c, source in sources.items() if source in flagged and c not in flagged]  # and made again
    files = Results(results)
    aside = files.rerun(time.strftime("%Y%m%d-%H%M%S"))
    sources: dict[Path, None] = {}
    for cell in flagged:
        sources.update(dict.fromkeys(cell_path(results, cell, kind) for kind in CELL_FILES))
        sources.update(dict.fromkeys(files.log(step, cell) for step, _ in STEPS))
        # the default target's tables: an unchanged table would not make the workflow rerun a cell
        sources.update(dict.fromkeys(files.default_tables))
    outside = [p for p in sources if not Path(os.path.normpath(p)).is_relative_to(os.path.normpath(results))]
    if outside:  # a cell id that climbs out of the results directory: nothing of another directory is moved
        raise UserError(f"rerun: {outside[0]} is outside {results}; nothing was moved")
    moves = [(path, aside / path.relative_to(results)) for path in sources if os.path.lexists(path)]
    if not moves:
        return flagged
    _check_writable([results, *{src.parent for src, _ in moves}])
    done: list[tuple[Path, Path]] = []
    try:
        for src, dst in moves:
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.move(src, dst)
            done.append((src, dst))
    except OSError as err:
        if os.path.lexists(src) and os.path.lexists(dst):  # a copy across filesystems cut short: not moved
            with contextlib.suppress(OSError):
                if dst.is_dir() and not dst.is_symlink():
                    shutil.rmtree(dst)
                else:
                    dst.unlink()
        back = _put_back(done, aside)
        said = f" ({back} could not be put back: they are under {aside})" if back else "; nothing was moved"
        raise UserError(f"rerun: cannot move {src} to {aside}: {err.strerror or err}{said}") from None
    return flagged


def _check_writable(directories: list[Path]) -> None:
    """Refuse, before anything moves, a directory that a set-aside file leaves or enters and cannot be written."""
    for directory in dict.fromkeys(directories):
        if not os.access(directory, os.W_OK | os.X_OK):
            raise UserError(f"rerun: cannot write {directory} (read-only?); nothing was moved")


def _put_back(done: list[tuple[Path, Path]], aside: Path) -> int:
    """Move files back where they were, newest first, and remove the directories left empty under ``aside``;
    the number of files that could not be put back."""
    failed = 0
    for src, dst in reversed(done):
        try:
            shutil.move(dst, src)
        except OSError:
            failed += 1
    for directory in sorted((d for d in aside.rglob("*") if d.is_dir()), reverse=True) + [aside]:
        with contextlib.suppress(OSError):  # not empty: something stayed there
            directory.rmdir()
    return failed
