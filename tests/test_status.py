"""``pipeline status`` and ``pipeline rerun --unstable`` on a results directory laid out as the workflow writes it."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.cli import main
from pipeline.report.status import failure_lines, rerun_unstable, status

CELLS = ["humaneval/pair/sd-T0-g2", "humaneval/pair/we-T0", "humaneval/pair/we_se-T0-g1-2", "humaneval/tiny/large-T0"]


def dims(cell) -> dict:
    """A cell's dimensions as the workflow writes them to grid.json (``cell.Dims``)."""
    return {
        "id": cell,
        "experiment": "e",
        "grid": "g",
        "model_set": "pair",
        "models": ["a", "b"],
        "large_model": "a",
    } | {"method": "sd", "family": "single", "kind": "sd", "dataset": "humaneval", "temperature": 0.0}


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


@pytest.fixture()
def results(tmp_path):
    """Four cells: sd done, we done but flagged, we_se failed in generation, large generating (a journal)."""
    res = tmp_path / "results"
    write(res / "grid.json", json.dumps([dims(c) for c in CELLS]))
    gen = res / "generations"
    for cell, flags in ((CELLS[0], []), (CELLS[1], ["interference on 3 of 10 samples"])):
        for suffix in (".jsonl", ".meta.json", ".scores.jsonl", ".summary.json", ".wandb.json"):
            write(gen / f"{cell}{suffix}", "{}\n")
        write(gen / f"{cell}.speed.json", json.dumps({"tokens_per_s": 9.0, "flags": flags}))
        for step in ("generate", "speed", "score", "wandb"):
            write(res / "logs" / step / f"{cell}.log", "done\n")
    write(
        res / "logs" / "generate" / f"{CELLS[2]}.log",
        "loading\nTraceback (most recent call last):\n  File x\nerror: CUDA out of memory: tried 2.00 GiB\n",
    )
    write(res / "logs" / "generate" / f"{CELLS[3]}.log", "1 of 2 samples already generated\n")
    write(res / "journal" / "humaneval" / "tiny" / "large-T0-abc123.jsonl", "{}\n")
    write(res / "logs" / "prepare" / "broken.log", "error: model 'broken': no such directory /x\n")
    write(res / "tables" / "cells.csv", "id\n" + "\n".join(CELLS))
    write(res / "tables" / "summary.md", "# Summary\n")
    return res


def test_status_counts_cells_and_says_why_each_failed(results, capsys):
    s = status(results)
    assert s.done == CELLS[:2] and s.running == [CELLS[3]] and s.pending == []
    assert s.failed == {
        "model broken": "error: model 'broken': no such directory /x",
        CELLS[2]: "generate: error: CUDA out of memory: tried 2.00 GiB",
    }
    assert s.unstable == {CELLS[1]: "interference on 3 of 10 samples"}
    assert failure_lines(results) == [
        "model broken: error: model 'broken': no such directory /x",
        f"cell {CELLS[2]}: generate: error: CUDA out of memory: tried 2.00 GiB",
    ]
    assert main(["status", str(results)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "4 cells: 2 done, 1 running, 2 failed, 0 pending; 1 flagged unstable"
    assert f"failed  {CELLS[2]}: generate: error: CUDA out of memory: tried 2.00 GiB" in out
    assert f"unstable {CELLS[1]}: interference on 3 of 10 samples" in out


def test_rerun_unstable_sets_aside_only_the_flagged_cells_files(results, capsys):
    before = {p: p.read_bytes() for p in results.rglob("*") if p.is_file()}
    assert main(["rerun", str(results), "--unstable"]) == 0
    assert capsys.readouterr().out.strip() == CELLS[1]
    after = {p: p.read_bytes() for p in results.rglob("*") if p.is_file()}
    gone = set(before) - set(after)
    tables = {results / "tables" / "cells.csv", results / "tables" / "summary.md"}  # remade by the workflow
    assert gone - tables and all(CELLS[1] in str(p) for p in gone - tables)  # the flagged cell's files only
    assert all(after[p] == data for p, data in before.items() if p not in gone)  # the rest as it was
    (aside,) = (results / "rerun").iterdir()
    moved = {p.relative_to(aside): p.read_bytes() for p in aside.rglob("*") if p.is_file()}
    assert moved == {p.relative_to(results): before[p] for p in gone}  # nothing lost
    s = status(results)
    assert s.pending == [CELLS[1]] and s.unstable == {} and s.done == [CELLS[0]]
    assert rerun_unstable(results) == []


def test_a_flagged_derived_cell_is_measured_again_by_its_source(results):
    """we-T0 takes its samples from sd-T0-g2's side-by-side runs (its cell file's samples_from): setting it aside
    sets aside the source too, whose generation makes both again."""
    write(results / "cells" / f"{CELLS[1]}.json", json.dumps({"cell": {}, "dims": {"samples_from": CELLS[0]}}))
    assert rerun_unstable(results) == [CELLS[1], CELLS[0]]
    assert status(results).pending == CELLS[:2]


def test_a_flagged_source_sets_aside_the_cells_derived_from_it(results):
    """sd-T0-g2 flagged: we-T0, made of its side-by-side runs, is made again with it, so its files go aside too."""
    write(results / "cells" / f"{CELLS[1]}.json", json.dumps({"cell": {}, "dims": {"samples_from": CELLS[0]}}))
    speed = results / "generations" / f"{CELLS[0]}.speed.json"
    speed.write_text(json.dumps({"tokens_per_s": 9.0, "flags": ["interference on 9 of 10 samples"]}))
    (results / "generations" / f"{CELLS[1]}.speed.json").write_text(json.dumps({"tokens_per_s": 9.0, "flags": []}))
    assert rerun_unstable(results) == [CELLS[0], CELLS[1]]
    assert status(results).pending == CELLS[:2]


@pytest.mark.parametrize(
    "content, says",
    [
        ({"cell": {}, "dims": {"samples_from": "../../outside"}}, 'samples_from "../../outside" is not a cell of'),
        ({"cell": {}, "dims": {"samples_from": "/etc/outside"}}, 'samples_from "/etc/outside" is not a cell of'),
        ({"cell": {}, "dims": {"samples_from": "humaneval/pair/nope"}}, "is not a cell of"),
        ([1, 2], "is not a cell file"),
        ({"cell": {}, "dims": "x"}, "is not a cell file"),
    ],
)
def test_a_cell_file_naming_a_source_outside_the_results_moves_nothing(results, tmp_path, capsys, content, says):
    """``samples_from`` is followed only to a cell of the results directory itself: a path out of it, an absolute
    one, a cell not in the grid, or a cell file that is not one, is one line, and no file moves (in or out)."""
    outside = tmp_path / "outside"
    for suffix in (".jsonl", ".speed.json"):  # what "../../outside" would reach from results/generations
        write(tmp_path / f"outside{suffix}", "keep\n")
    write(results / "cells" / f"{CELLS[1]}.json", json.dumps(content))
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    assert main(["rerun", str(results), "--unstable"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and says in err and "nothing was moved" in err and len(err.splitlines()) == 1
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before and outside.with_suffix(".jsonl")
    assert not (results / "rerun").exists()


def test_an_index_or_cell_file_that_is_a_pipe_is_one_line_not_a_wait(results, capsys):
    """A FIFO in place of grid.json or of a cell file would block a reader forever: status and rerun refuse it."""
    for path in (results / "grid.json", results / "cells" / f"{CELLS[1]}.json"):
        saved = path.read_bytes() if path.exists() else None
        path.parent.mkdir(parents=True, exist_ok=True)
        path.unlink(missing_ok=True)
        os.mkfifo(path)
        assert main(["rerun", str(results), "--unstable"]) == 2
        assert "not a regular file" in capsys.readouterr().err
        path.unlink()
        if saved is not None:
            path.write_bytes(saved)
    assert main(["status", str(results)]) == 0


def test_status_reads_a_huge_log_by_its_end_and_a_pipe_in_place_of_a_record_or_log_without_waiting(results):
    """A failed job's cause is its log's last error line: a 1.5 GB log (sparse here) is read by its end, not whole;
    a FIFO in place of a cell's speed record is a flag saying so, one in place of a log names no cause; none of
    them blocks ``status``."""
    import time

    log = results / "logs" / "generate" / f"{CELLS[2]}.log"
    with open(log, "r+b") as f:
        f.truncate(1_500_000_000)
        f.seek(0, 2)
        f.write(b"\nerror: the disk is full\n")
    speed = results / "generations" / f"{CELLS[0]}.speed.json"
    speed.unlink()
    os.mkfifo(speed)
    (results / "logs" / "generate" / f"{CELLS[3]}.log").unlink()
    os.mkfifo(results / "logs" / "generate" / f"{CELLS[3]}.log")
    started = time.perf_counter()
    s = status(results)
    assert time.perf_counter() - started < 10
    assert s.failed[CELLS[2]] == "generate: error: the disk is full"
    assert s.unstable[CELLS[0]].startswith(f"{CELLS[0].split('/')[-1]}.speed.json cannot be read (is not a regular")
    assert CELLS[3] in s.running


def test_a_failed_derive_is_named(results):
    """we-T0 was generated once (its generate log, older) and is derived since; its derive job failed."""
    (results / "generations" / f"{CELLS[1]}.jsonl").unlink()
    os.utime(results / "logs" / "generate" / f"{CELLS[1]}.log", (1e9, 1e9))
    write(results / "logs" / "derive" / f"{CELLS[1]}.log", "error: samples file x.jsonl not found\n")
    assert status(results).failed[CELLS[1]] == "derive: error: samples file x.jsonl not found"


def test_status_of_a_directory_that_is_no_results_is_one_line(tmp_path, capsys):
    assert main(["status", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "grid.json" in err and str(tmp_path) in err


@pytest.mark.parametrize("damage", [b"{not json", b"\xff\xfe", b"[1, 2]", b'{"flags": "x"}'])
def test_a_speed_record_that_cannot_be_read_is_flagged_not_done_and_set_aside(results, damage, capsys):
    (results / "generations" / f"{CELLS[0]}.speed.json").write_bytes(damage)
    s = status(results)
    assert CELLS[0] in s.unstable and "judge the cell again" in s.unstable[CELLS[0]]
    assert main(["status", str(results)]) == 0
    assert any(line.startswith(f"unstable {CELLS[0]}: ") for line in capsys.readouterr().out.splitlines())
    assert sorted(rerun_unstable(results)) == sorted(CELLS[:2])
    assert not (results / "generations" / f"{CELLS[0]}.speed.json").exists()  # set aside: judged again


def _files(results: Path) -> dict[Path, bytes]:
    return {p: p.read_bytes() for p in results.rglob("*") if p.is_file()}


def test_a_move_that_fails_midway_puts_every_file_back(results, monkeypatch, capsys):
    """All or none: the fourth file cannot move, the three moved before it are put back, one line says so."""
    import shutil

    import pipeline.report.status as status_module

    before, real, calls = _files(results), shutil.move, []

    def failing(src, dst):
        calls.append(src)
        if len(calls) == 4:
            raise OSError(28, "No space left on device")
        return real(src, dst)

    monkeypatch.setattr(status_module.shutil, "move", failing)
    assert main(["rerun", str(results), "--unstable"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "No space left on device; nothing was moved" in err, err
    assert _files(results) == before
    assert not list((results / "rerun").iterdir())  # the set-aside directory taken away again
    assert status(results).unstable == {CELLS[1]: "interference on 3 of 10 samples"}  # still done, still flagged


def test_a_directory_that_cannot_be_written_is_refused_before_anything_moves(results, monkeypatch, capsys):
    import pipeline.report.status as status_module

    before, locked = _files(results), results / "logs" / "score" / "humaneval" / "pair"
    real = status_module.os.access
    monkeypatch.setattr(status_module.os, "access", lambda path, mode: Path(path) != locked and real(path, mode))
    assert main(["rerun", str(results), "--unstable"]) == 2
    err = capsys.readouterr().err
    assert err == f"error: rerun: cannot write {locked} (read-only?); nothing was moved\n"
    assert _files(results) == before and not (results / "rerun").exists()


def test_cells_whose_files_are_on_another_filesystem_are_copied_then_deleted(results, tmp_path_factory):
    """logs/ on another filesystem (a tmpfs): rename cannot cross, the move copies and deletes, all of it."""
    import os
    import shutil

    other = Path("/dev/shm")
    if not other.is_dir() or os.stat(other).st_dev == os.stat(results).st_dev:
        pytest.skip("no second filesystem here")
    elsewhere = Path(shutil.copytree(results / "logs", other / f"logs-{os.getpid()}-{id(results)}"))
    try:
        shutil.rmtree(results / "logs")
        (results / "logs").symlink_to(elsewhere)
        logs = {step: (elsewhere / step / f"{CELLS[1]}.log").read_bytes() for step in ("generate", "speed")}
        assert rerun_unstable(results) == [CELLS[1]]
        (aside,) = (results / "rerun").iterdir()
        for step, data in logs.items():
            assert not (elsewhere / step / f"{CELLS[1]}.log").exists()
            assert (aside / "logs" / step / f"{CELLS[1]}.log").read_bytes() == data
        assert status(results).pending == [CELLS[1]]
    finally:
        shutil.rmtree(elsewhere, ignore_errors=True)


# ---- any results directory, damaged as it may be: a report or one line, and rerun all or none ----------------

IDS = ["humaneval/pair/sd-T0-g2", "humaneval/pair/we-T0", "gsm8k/x/large-T0"]
CONTENTS = {  # what a file of a cell may hold, or be
    "record": b'{"flags": []}',
    "flagged": b'{"flags": ["interference on 2 of 10 samples"]}',
    "flags not a list": b'{"flags": "x"}',
    "not an object": b"[1, 2]",
    "torn": b'{"flags": [',
    "not UTF-8": b"\xff\xfe\x00",
    "an error log": b"Traceback (most recent call last):\nerror: CUDA out of memory\n",
    "empty": b"",
    "a directory": None,
    "a dangling link": "link",
}
GRIDS = st.one_of(
    st.just([dims(c) for c in IDS]),
    st.lists(st.builds(dims, st.sampled_from([*IDS, "../escape", "/abs", "", ".", "a//b", 7]))),
    st.sampled_from([b"{not json", b"\xff", b"{}", b'[{"no_id": 1}]', b"[1]", b"null", None]),
)


def _lay(root: Path, files: dict[str, str], grid) -> None:
    root.mkdir()
    if grid is not None:
        (root / "grid.json").write_bytes(grid if isinstance(grid, bytes) else json.dumps(grid).encode())
    for name, kind in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if CONTENTS[kind] is None:
            path.mkdir(exist_ok=True)
        elif CONTENTS[kind] == "link":
            path.symlink_to(root / "nowhere")
        else:
            path.write_bytes(CONTENTS[kind])


def _cell_files():
    cells = st.sampled_from(IDS)
    names = st.one_of(
        st.builds(
            lambda c, s: f"generations/{c}{s}", cells, st.sampled_from([".jsonl", ".speed.json", ".summary.json"])
        ),
        st.builds(lambda c, s: f"logs/{s}/{c}.log", cells, st.sampled_from(["generate", "speed", "score", "wandb"])),
        st.builds(lambda c: f"journal/{c}-abc.jsonl", cells),
        st.sampled_from(["tables/cells.csv", "tables/summary.md", "logs/prepare/m.log"]),
    )
    return st.dictionaries(names, st.sampled_from(list(CONTENTS)), max_size=12)


def _everything(root: Path) -> dict[str, bytes | str]:
    """Every entry under ``root`` by its path below the results or its set-aside copy: bytes, 'dir' or 'link'."""
    out = {}
    for path in root.rglob("*"):
        rel = path.relative_to(root).as_posix()
        if rel.startswith("rerun/"):
            rel = rel.split("/", 2)[2] if rel.count("/") >= 2 else None
        if rel:
            out[rel] = "link" if path.is_symlink() else "dir" if path.is_dir() else path.read_bytes()
    return out


@settings(max_examples=150, deadline=None, derandomize=True, database=None)
@given(files=_cell_files(), grid=GRIDS)
def test_any_results_directory_is_a_report_or_one_line_and_rerun_loses_nothing(files, grid):
    import tempfile

    from pipeline.errors import UserError
    from pipeline.report.status import report

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "results"
        _lay(root, files, grid)
        before = {k: v for k, v in _everything(root).items() if v != "dir"}
        try:
            assert report(root).splitlines()[0].endswith("flagged unstable")
        except UserError as err:
            assert "\n" not in str(err) and str(err)
            return
        moved = rerun_unstable(root)
        after = {k: v for k, v in _everything(root).items() if v != "dir"}
        assert after == before  # every file kept, in place or set aside
        assert not set(moved) & set(status(root).unstable)  # what was set aside is flagged no more


def test_a_rule_takes_the_results_root_from_its_own_file_through_the_layout(tmp_path):
    """``Results.root_of``: the root a job sees, from its own path of a file the layout names (a storage plugin
    may hand it another prefix than the config's); a path that is not that file is refused, never guessed."""
    from pipeline.experiment.paths import Results

    layout = Results("results")
    assert layout.root_of("results/grid.json", layout.grid) == "results"
    staged = ".snakemake/storage/fs/results/tables/cells.csv"
    assert layout.root_of(staged, layout.cells_table) == ".snakemake/storage/fs/results"
    cell = "humaneval/smol+l2/sd-T1-g3"
    assert layout.root_of(f"/scratch/r/generations/{cell}.wandb.json", layout.cell(cell, "wandb")) == "/scratch/r"
    with pytest.raises(ValueError, match="is not the file results/grid.json"):
        layout.root_of("results/tables/cells.csv", layout.grid)


def test_a_failed_cell_whose_error_lies_far_before_its_logs_end_is_failed_not_running(results):
    """A job that printed 100 KB after its error (a long traceback's frames, a library's teardown) failed all the
    same: its cause is searched past the log's last 64 KB (and a log is never read whole past 64 MiB)."""
    log = results / "logs" / "generate" / f"{CELLS[2]}.log"
    log.write_text(log.read_text() + "".join(f"  teardown line {i}\n" for i in range(6000)))
    assert log.stat().st_size > 100_000
    assert status(results).failed[CELLS[2]] == "generate: error: CUDA out of memory: tried 2.00 GiB"
