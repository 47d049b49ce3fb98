"""The generation journal (pipeline/job/journal.py): a crash or a damaged line costs only that line, every good
sample is kept byte for byte and each id once (also under Hypothesis); one job per cell (its lock, held by a real
second process); neither the journal nor its lock writes through a link, a directory or a pipe."""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from pipeline.job.journal import Journal

TRIED = settings(derandomize=True, database=None, deadline=None, suppress_health_check=list(HealthCheck))
IDS = [f"e{i}" for i in range(10)]


def sample(i: int) -> bytes:
    return json.dumps({"id": f"e{i}", "output": f"out {i}", "n": i}).encode()


def needs_output(row):
    return None if "output" in row else "missing fields ['output']"


def recover(path: Path, data: bytes) -> tuple[dict[str, bytes], list[dict]]:
    path.write_bytes(data)
    kept = Journal(path, IDS, needs_output).recover()
    rejected = Path(f"{path}.rejected")
    return kept, [json.loads(line) for line in rejected.read_text().splitlines()] if rejected.exists() else []


# ---- journals ---------------------------------------------------------------------------------------


def test_a_corrupt_line_in_the_middle_costs_only_itself(tmp_path):
    good = [sample(i) for i in range(10)]
    data = b"\n".join(good[:3] + [b'{"id": "e3", "outp'] + good[4:]) + b"\n"
    kept, rejected = recover(tmp_path / "j.jsonl", data)
    assert list(kept) == [f"e{i}" for i in range(10) if i != 3]  # 9 of 10 kept, not 3
    assert all(kept[f"e{i}"] == good[i] for i in range(10) if i != 3)  # byte for byte
    assert [r["line"] for r in rejected] == [4] and rejected[0]["reason"] == "not valid JSON"
    assert rejected[0]["raw"] == '{"id": "e3", "outp'
    assert (tmp_path / "j.jsonl").read_bytes() == b"".join(g + b"\n" for i, g in enumerate(good) if i != 3)


def test_a_complete_last_line_without_newline_is_repaired_not_glued(tmp_path):
    path = tmp_path / "j.jsonl"
    kept, rejected = recover(path, sample(0) + b"\n" + sample(1))
    assert list(kept) == ["e0", "e1"] and not rejected
    assert path.read_bytes() == sample(0) + b"\n" + sample(1) + b"\n"
    journal = Journal(path, IDS, needs_output)
    with journal.writer() as add:
        add({"id": "e2", "output": "out 2", "n": 2})
    assert list(journal.recover()) == ["e0", "e1", "e2"]  # the next sample is a line of its own


def test_a_line_torn_by_a_crash_is_set_aside(tmp_path):
    kept, rejected = recover(tmp_path / "j.jsonl", sample(0) + b"\n" + sample(1)[:12])
    assert list(kept) == ["e0"] and rejected[0]["reason"] == "a line torn by a crash mid-write"


@pytest.mark.parametrize(
    "line, reason",
    [
        (b"[1, 2, 3]", "a JSON list, not an object"),
        (b'"just a string"', "a JSON str, not an object"),
        (b'{"output": "no id"}', "no string 'id'"),
        (b'{"id": 7, "output": "x"}', "no string 'id'"),
        (b'{"id": "HumanEval/999", "output": "x"}', "id 'HumanEval/999' is not an example of this cell"),
        (b'{"id": "e0", "output": "again"}', "a second line for id 'e0' (the first is kept)"),
        (b'{"id": "e5"}', "missing fields ['output']"),
        (b"\xff\xfe not utf-8", "not valid JSON"),
    ],
)
def test_every_kind_of_bad_line_is_rejected_with_its_reason(tmp_path, line, reason):
    data = sample(0) + b"\n" + line + b"\n" + sample(1) + b"\n" + line  # also as the last, unterminated line
    kept, rejected = recover(tmp_path / "j.jsonl", data)
    assert kept == {"e0": sample(0), "e1": sample(1)}
    assert [r["reason"] for r in rejected][0] == reason
    assert len(rejected) == 2  # both copies; neither stops the lines after it
    raw = rejected[0]["raw"].encode("utf-8", "surrogateescape")
    assert raw == line  # set aside byte for byte


@pytest.mark.parametrize("kind", ["link", "directory", "fifo", "hard link"])
def test_the_lock_and_the_journal_never_write_through_what_they_did_not_make(tmp_path, kind):
    """A symbolic link, a directory, a pipe or a hard link (a second name of another file) where the journal or
    its lock goes is refused in one line, and what a link points to is left as it was (it was truncated and
    overwritten with a pid line, or had samples appended)."""
    from pipeline.files import ResultsError
    from pipeline.job.journal import Journal, journal_lock

    victim = tmp_path / "precious.txt"
    victim.write_text("keep me\n")
    journal = tmp_path / "cell.jsonl"
    for target in (Path(f"{journal}.lock"), journal):
        if kind == "link":
            target.symlink_to(victim)
        elif kind == "hard link":
            os.link(victim, target)
        elif kind == "directory":
            target.mkdir()
        else:
            os.mkfifo(target)
        with pytest.raises(
            ResultsError, match=r"cannot write the (lock of the cell journal|journal) .*: it is "
        ) as err:
            if target == journal:
                with Journal(journal, ["a"], lambda row: None).writer() as add:
                    add({"id": "a"})
            else:
                with journal_lock(journal):
                    pass
        assert "\n" not in str(err.value) and "remove it" in str(err.value)
        assert victim.read_text() == "keep me\n"
        if kind == "directory":
            target.rmdir()
        else:
            target.unlink()


def test_a_journal_that_is_a_pipe_or_a_device_is_one_line_and_a_full_disk_keeps_what_was_written(tmp_path):
    """Reading back a journal that is a FIFO (it would block) or a link to /dev/zero (it would be read until memory
    runs out) is one line at once; a write the disk refuses (ENOSPC) is one line, the samples before it kept."""
    from pipeline.errors import UserError
    from pipeline.files import ResultsError

    journal = tmp_path / "cell.jsonl"
    os.mkfifo(journal)
    with pytest.raises(UserError, match="not a regular file"):
        Journal(journal, IDS, needs_output).recover()
    journal.unlink()
    journal.symlink_to("/dev/zero")
    started = time.perf_counter()
    with pytest.raises(UserError, match="is a symbolic link"):  # not followed: nothing is read through it
        Journal(journal, IDS, needs_output).recover()
    assert time.perf_counter() - started < 5
    journal.unlink()
    log = Journal(journal, IDS, needs_output)
    with log.writer() as add:
        add(json.loads(sample(0)))
        real = os.fsync
        try:
            os.fsync = lambda fd: (_ for _ in ()).throw(OSError(28, "No space left on device"))
            with pytest.raises(ResultsError, match="No space left on device; the samples already written are kept"):
                add(json.loads(sample(1)))
        finally:
            os.fsync = real
    assert list(Journal(journal, IDS, needs_output).recover()) == ["e0", "e1"]  # written, not yet synced


# ---- under Hypothesis ---------------------------------------------------------------------------


FEW_IDS = [f"e{i}" for i in range(4)]


def good(sample_id: str, n: int) -> bytes:
    return json.dumps({"id": sample_id, "output": f"out {n}", "token_ids": [n]}).encode()


def needs_string_output(row):
    return None if isinstance(row.get("output"), str) else "no output"


NEAR_MISSES = [  # JSON, but not one of the cell's samples
    b'{"id": "zz", "output": "x"}',
    b'{"id": "e1"}',
    b'{"id": 1, "output": "x"}',
    b'{"output": "x"}',
    b'["e1", "x"]',
    b'"e1"',
    b'{"id": "e2", "output": 7}',
    b"null",
]
pieces = st.lists(
    st.one_of(
        st.tuples(st.just("good"), st.sampled_from(FEW_IDS), st.integers(0, 9)),
        st.tuples(st.just("bytes"), st.binary(max_size=30).map(lambda b: b.replace(b"\n", b"")), st.just(0)),
        st.tuples(st.just("bytes"), st.sampled_from(NEAR_MISSES), st.just(0)),
    ),
    max_size=8,
)


@settings(TRIED, max_examples=200)
@given(pieces, st.booleans())
def test_the_journal_keeps_every_good_line_and_nothing_else(lines, final_newline):
    data = [good(a, n) if kind == "good" else a for kind, a, n in lines]
    raw = b"\n".join(data) + (b"\n" if final_newline and data else b"")
    expected: dict[str, bytes] = {}
    for kind, a, n in lines:
        if kind == "good":
            expected.setdefault(a, good(a, n))
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "cell.jsonl"
        path.write_bytes(raw)
        journal = Journal(path, FEW_IDS, needs_string_output)
        with contextlib.redirect_stderr(io.StringIO()):  # each rejected line is reported there
            kept = journal.recover()
        event("handled: lines set aside" if any(k != "good" for k, _, _ in lines) else "handled: clean")
        assert kept == expected  # every good line, byte for byte, the first of each id; nothing else
        assert path.read_bytes() in (raw, b"".join(line + b"\n" for line in kept.values()))
        assert journal.recover() == expected  # a repaired journal reads the same again


# ---- one job per cell -----------------------------------------------------------------------------


HOLDER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from pipeline.job.journal import journal_lock
    with journal_lock(Path(sys.argv[1])):
        with open(sys.argv[1], "a") as f:
            f.write(sys.argv[2] + "\\n")
        print("held", flush=True)
        time.sleep(120)
    """
)


def hold(journal, line=""):
    """A real second process that takes the cell's lock (and appends ``line`` to the journal), then sleeps."""
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(journal), line], stdout=subprocess.PIPE, text=True, cwd=os.getcwd()
    )
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_a_second_job_on_a_cell_being_generated_stops_at_once_naming_the_first(tmp_path):
    from pipeline.files import LockHeld
    from pipeline.job.journal import journal_lock

    journal = tmp_path / "cell.jsonl"
    proc = hold(journal)
    try:
        start = time.perf_counter()
        held = rf"cell journal {journal} is in use by pid {proc.pid} on \S+"
        with pytest.raises(LockHeld, match=held), journal_lock(journal):
            pass
        assert time.perf_counter() - start < 1
    finally:
        proc.kill()
        proc.wait()
    with journal_lock(journal):  # the holder died: its lock went with it
        assert (tmp_path / "cell.jsonl.lock").read_text().startswith(f"pid {os.getpid()} ")
    assert not (tmp_path / "cell.jsonl.lock").exists()


def test_a_held_lock_with_binary_content_is_still_one_line(tmp_path):
    from pipeline.files import LockHeld
    from pipeline.job.journal import journal_lock

    journal = tmp_path / "cell.jsonl"
    proc = hold(journal)
    try:
        (tmp_path / "cell.jsonl.lock").write_bytes(b"\xff\xfe\x00\x1b[2J" * 5000)  # the same file, still locked
        with pytest.raises(LockHeld) as caught, journal_lock(journal):
            pass
        message = str(caught.value)
        assert "\n" not in message and len(message) < 500 and f"cell journal {journal} is in use by" in message
    finally:
        proc.kill()
        proc.wait()


def test_a_full_disk_under_the_journal_is_the_promised_line_not_the_closing_files_error(tmp_path, monkeypatch):
    """A write the disk refuses (here /dev/full: every write is ENOSPC) leaves the line buffered; closing the file
    on the way out would try it again. The job stops with the journal's one line, never the OSError of closing."""
    import pipeline.job.journal as journal_module
    from pipeline.files import ResultsError

    full = open("/dev/full", "a")  # noqa: SIM115  (the journal's writer closes it, as it closes its own file)
    monkeypatch.setattr(journal_module, "open_own", lambda path, mode, what: full)
    writer = Journal(tmp_path / "cell.jsonl", IDS, needs_output).writer()
    said = "cannot write the journal .*No space left on device; the samples"
    with pytest.raises(ResultsError, match=said), writer as add:
        add(json.loads(sample(0)))
    assert full.closed
