"""``pipeline status`` and ``pipeline rerun --unstable`` on a results directory laid out as the workflow writes it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeline.cli import main
from pipeline.status import failure_lines, rerun_unstable, status

CELLS = ["humaneval/pair/sd-T0-g2", "humaneval/pair/we-T0", "humaneval/pair/we_se-T0-g1-2", "humaneval/tiny/large-T0"]


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


@pytest.fixture()
def results(tmp_path):
    """Four cells: sd done, we done but flagged, we_se failed in generation, large generating (a journal)."""
    res = tmp_path / "results"
    write(res / "grid.json", json.dumps([{"id": c} for c in CELLS]))
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
