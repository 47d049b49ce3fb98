"""The generation job: per-sample records, resume after a crash, side-by-side baseline."""

from __future__ import annotations

import contextlib
import json

import pytest

from pipeline.errors import UserError
from pipeline.experiment.cell import Cell
from pipeline.job.generate import run_cell
from pipeline.models import ModelSpec


def test_generation_job_records_resumes_and_compares(tiny_dir, tmp_path):
    models = [ModelSpec("a", str(tiny_dir)), ModelSpec("b", str(tiny_dir))]
    cell = Cell(
        models=models,
        method="we_se",
        task="humaneval",
        gamma=[1, 2],
        method_args={"lambda": 0.5},
        size=3,
        max_new_tokens=6,
        baseline="we",
        baseline_args={"lambda": 0.5},
    )
    out = tmp_path / "gen" / "cell.jsonl"
    summary = run_cell(cell, out, progress=False)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 3 and summary["samples"] == 3
    for row in rows:
        assert row["output"] == row["baseline"]["output"]  # greedy: lossless against its baseline
        assert row["stats"]["method"] == "we_se" and row["baseline"]["stats"]["method"] == "we"
    assert summary["speedup_side_by_side"] > 0 and summary["tokens_per_s"] > 0
    meta = json.loads(out.with_suffix(".meta.json").read_text())
    assert meta["cell"]["models"] == ["a", "b"] and "torch" in meta["environment"]

    # a crash after the first sample, mid-way through writing the second: the torn line is dropped
    lines = out.read_text().splitlines()
    out.write_text(lines[0] + "\n" + lines[1][:25])
    run_cell(cell, out, progress=False)
    again = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["id"] for r in again] == [r["id"] for r in rows]
    assert again[0] == rows[0]  # kept, not generated again


def test_generate_command(tiny_dir, tmp_path, capsys):
    from pipeline.cli import main

    cell = tmp_path / "cell.json"
    cell.write_text(
        json.dumps(
            {
                "cell": {
                    "models": [{"name": "a", "source": str(tiny_dir)}],
                    "method": "large_model",
                    "task": "humaneval",
                    "size": "tiny",
                    "max_new_tokens": 4,
                }
            }
        )
    )
    assert main(["generate", str(cell), str(tmp_path / "out.jsonl")]) == 0
    assert len((tmp_path / "out.jsonl").read_text().splitlines()) == 5
    cell.write_text(json.dumps({"cell": {"models": ["a"], "method": "sd", "task": "humaneval", "colour": "red"}}))
    assert main(["generate", str(cell), str(tmp_path / "bad.jsonl")]) == 2
    assert "unknown cell keys ['colour']" in capsys.readouterr().err


def test_a_standard_cell_derived_from_side_by_side_runs_has_its_own_jobs_samples(tiny_dir, tiny_dir2, tmp_path):
    """The grid pairs a standard cell with a cell that runs its method beside each sample on the same models,
    prompts and sampling (and with nothing else: another model set, another temperature); the samples taken from
    there are token for token those the cell's own generation job makes, at T = 1 too (seeded per sample), each
    timed by its own run."""
    from pipeline.experiment.cell import CellFile
    from pipeline.experiment.config import check_config
    from pipeline.experiment.grid import expand_cells
    from pipeline.job.derive import derive_cell

    from .tiny_dag import tiny_config

    config = tiny_config(tiny_dir, tiny_dir2)
    config["grids"][1]["methods"] = ["we", "we_se", "we_sd"]
    cells = expand_cells(check_config(config))
    derived = {c: e.dims.samples_from for c, e in cells.items() if e.dims.samples_from}
    assert derived == {
        "humaneval/pair/we-T0": "humaneval/pair/we_se-T0-g1-2",
        "humaneval/trio/we-T1": "humaneval/trio/we_se-T1-g1-2-2",
    }  # large_model on one model is not sd's pair; the null cell and the speculative cells generate their own
    source, own = cells["humaneval/trio/we_se-T1-g1-2-2"], cells["humaneval/trio/we-T1"]
    run_cell(source.cell, tmp_path / "source.jsonl", progress=False, speed=False)
    run_cell(own.cell, tmp_path / "own.jsonl", progress=False, speed=False)
    own.write(tmp_path / "cell.json")
    assert derive_cell(tmp_path / "cell.json", tmp_path / "source.jsonl", tmp_path / "derived.jsonl") == 2
    made, taken = (
        [json.loads(x) for x in (tmp_path / f).read_text().splitlines()] for f in ("own.jsonl", "derived.jsonl")
    )
    pairs = [json.loads(x) for x in (tmp_path / "source.jsonl").read_text().splitlines()]
    assert [r["token_ids"] for r in taken] == [r["token_ids"] for r in made]
    assert [r["output"] for r in taken] == [r["output"] for r in made] and len({r["output"] for r in taken}) == 2
    for row, pair in zip(taken, pairs):
        counted = pair["timing"]["attempts"][pair["timing"]["counted"]]
        assert row["stats"] == pair["baseline"]["stats"] and row["stats"]["method"] == "we"
        assert row["timing"]["attempts"][row["timing"]["counted"]]["method"] == counted["baseline"]
        assert row["samples_from"] == "humaneval/trio/we_se-T1-g1-2-2"
    meta = json.loads((tmp_path / "derived.meta.json").read_text())
    assert meta["samples_from"] == "humaneval/trio/we_se-T1-g1-2-2" and meta["cell"]["method"] == "we"
    CellFile(cells["humaneval/trio/we_sd-T1-g2"].cell, own.dims).write(tmp_path / "wrong.json")
    with pytest.raises(UserError, match=r"runs 'we' with \{\} beside its samples, not 'we_sd'"):
        derive_cell(tmp_path / "wrong.json", tmp_path / "source.jsonl", tmp_path / "x.jsonl")
    other = CellFile(Cell.from_json({**own.cell.to_json(), "max_new_tokens": 7}), own.dims)
    other.write(tmp_path / "other.json")
    with pytest.raises(UserError, match="ran with other max_new_tokens than cell humaneval/trio/we-T1"):
        derive_cell(tmp_path / "other.json", tmp_path / "source.jsonl", tmp_path / "x.jsonl")
    good_meta, good_rows = (tmp_path / "source.meta.json").read_text(), pairs
    for setting in ("temperature", "models", "seed"):  # a setting the source does not record is not known to match
        meta = json.loads(good_meta)
        del meta["cell"][setting]
        (tmp_path / "source.meta.json").write_text(json.dumps(meta))
        with pytest.raises(UserError, match=f"does not record its {setting}: cannot derive cell humaneval/trio/we-T1"):
            derive_cell(tmp_path / "cell.json", tmp_path / "source.jsonl", tmp_path / "x.jsonl")
    (tmp_path / "source.meta.json").write_text(good_meta)
    (tmp_path / "bad.meta.json").write_text(good_meta)
    damaged_timing = [{**good_rows[0], "timing": {"attempts": [{}], "counted": 0}}, good_rows[1]]
    for rows, says in (
        (good_rows[:1], f"lacks prompt {good_rows[1]['id']!r}"),
        ([*good_rows, good_rows[0]], f"holds prompt {good_rows[0]['id']!r} twice"),
        ([*good_rows, {**good_rows[0], "id": "HumanEval/999"}], "holds prompt 'HumanEval/999', which cell"),
        (damaged_timing, "has a damaged timing record"),
    ):
        (tmp_path / "bad.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        with pytest.raises(UserError, match=says):
            derive_cell(tmp_path / "cell.json", tmp_path / "bad.jsonl", tmp_path / "x.jsonl")
        assert not (tmp_path / "x.jsonl").exists()
    (tmp_path / "bad.jsonl").write_text("".join(json.dumps(r) + "\n" for r in reversed(good_rows)))
    assert derive_cell(tmp_path / "cell.json", tmp_path / "bad.jsonl", tmp_path / "x.jsonl") == 2  # in its own order
    assert [json.loads(x)["id"] for x in (tmp_path / "x.jsonl").read_text().splitlines()] == [r["id"] for r in made]
    (tmp_path / "x.jsonl").unlink()
    (tmp_path / "x.meta.json").unlink()
    import pipeline.job.derive as derive_module

    write = derive_module.write_atomic
    for full in ("x.jsonl", "x.meta.json"):  # a full disk at either file: one line, neither left behind

        def on_a_full_disk(path, text, full=full):
            if path.name == full:
                raise OSError(28, "No space left on device")
            write(path, text)

        derive_module.write_atomic = on_a_full_disk
        try:
            with pytest.raises(UserError, match=r"^cannot write cell humaneval/trio/we-T1's samples .*No space left"):
                derive_cell(tmp_path / "cell.json", tmp_path / "source.jsonl", tmp_path / "x.jsonl")
        finally:
            derive_module.write_atomic = write
        assert not (tmp_path / "x.jsonl").exists() and not (tmp_path / "x.meta.json").exists()
    (tmp_path / "source.meta.json").write_text("{not json")
    with pytest.raises(UserError, match="source.meta.json"):
        derive_cell(tmp_path / "cell.json", tmp_path / "source.jsonl", tmp_path / "x.jsonl")
    assert not (tmp_path / "x.jsonl").exists()
    parallel = json.loads(json.dumps(config))
    parallel["grids"][1]["methods"] = ["we", "we_p", "we_sd"]  # we_p first: a job of a thread per model
    entries = expand_cells(check_config(parallel))
    assert entries["humaneval/trio/we-T1"].dims.samples_from == "humaneval/trio/we_sd-T1-g2"


def assert_resumed_as_the_run(cell, expected, tmp_path, monkeypatch):
    """Kill ``cell`` after two journalled samples, resume it, and check every sample against ``expected`` (the
    uninterrupted run's): the same ids and tokens, the same accepted and rounds, the same recycled table left."""
    from pipeline.job import journal as journal_module

    class Killed(BaseException):
        pass

    real = journal_module.Journal.writer

    def killed_after_two(self):
        with real(self) as add:
            written = []

            def add_then_die(row):
                if len(written) == 2:
                    raise Killed
                add(row)
                written.append(row)

            yield add_then_die

    monkeypatch.setattr(journal_module.Journal, "writer", contextlib.contextmanager(killed_after_two))
    out, journal = tmp_path / "cell.jsonl", tmp_path / "journal.jsonl"
    with pytest.raises(Killed):
        run_cell(cell, out, progress=False, journal=journal)
    monkeypatch.undo()
    run_cell(cell, out, progress=False, journal=journal)
    resumed = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["id"] for r in resumed] == [r["id"] for r in expected]
    for got, want in zip(resumed, expected):
        assert got["token_ids"] == want["token_ids"]
        for key in ("accepted", "rounds"):
            assert got["stats"][key] == want["stats"][key], (got["id"], key)
        assert got["recycled"] == want["recycled"]


def test_a_killed_suffix_recycle_cell_resumes_as_the_run_it_continues(tiny_dir, tmp_path, monkeypatch):
    """Everything a proposer carries across prompts is restored from the journal: a ``suffix+recycle`` cell killed
    after two prompts resumes with the corpus the uninterrupted run had (the done prompts' outputs and the recycled
    table they left), so every prompt after the kill accepts what the uninterrupted run accepted, token for token."""

    cell = Cell(
        models=[ModelSpec("a", str(tiny_dir))],
        method="sd",
        task="humaneval",
        gamma=2,
        method_args={"proposer": "suffix+recycle"},
        size=5,
        max_new_tokens=16,
        baseline="large_model",
    )
    whole = tmp_path / "whole.jsonl"
    run_cell(cell, whole, progress=False)
    expected = [json.loads(line) for line in whole.read_text().splitlines()]
    assert all("recycled" in r for r in expected) and any(r["recycled"] for r in expected)

    assert_resumed_as_the_run(cell, expected, tmp_path, monkeypatch)


def test_a_journalled_recycled_table_is_typed_before_a_resume_takes_it():
    """A journal line's ``recycled`` rows are ids of the vocabulary or nothing: a resume takes none of a damaged
    line (a key of 5,000 digits, a negative or out-of-range id, a string, a row that is no list)."""
    from pipeline.job.generate import recycled_rows

    assert recycled_rows({"recycled": {"5": [1, 2], "7": []}}, 10) == {5: [1, 2], 7: []}
    for bad in ({"9" * 5000: [1]}, {"5": [-1]}, {"5": [10]}, {"5": ["1"]}, {"x": [1]}, {"5": 3}, [1], None):
        assert recycled_rows({"recycled": bad}, 10) is None, bad
    assert recycled_rows({}, 10) is None


def test_a_killed_union_vocabulary_recycle_cell_resumes_as_the_run_it_continues(smol_tokenizer, tmp_path, monkeypatch):
    """Models of different tokenizers decode over the union of their vocabularies, so the recycled table a sample
    leaves holds union ids, past the first model's tokenizer (whose tokens are the prompts'): a ``suffix+recycle``
    cell over such a set, killed after two prompts, resumes with the table the uninterrupted run had (its ids
    checked against the union's size, not the first tokenizer's), so every later prompt accepts what it accepted."""
    from pipeline.models.student import train_tokenizer

    from .conftest import save_tiny

    small = train_tokenizer(["def main():\n    return 0\n" * 50, "import os, sys\n" * 50], 300, smol_tokenizer)
    own = save_tiny(tmp_path / "own", small, seed=3, layers=1)
    big = save_tiny(tmp_path / "big", smol_tokenizer, layers=1, init=0.5)  # peaked rows lead the union's
    cell = Cell(
        models=[ModelSpec("own", str(own)), ModelSpec("big", str(big))],
        method="we_sd",
        task="humaneval",
        gamma=2,
        method_args={"lambda": 0.5, "proposer": "suffix+recycle"},
        size=5,
        max_new_tokens=16,
        baseline="we",
        baseline_args={"lambda": 0.5},
    )
    whole = tmp_path / "whole.jsonl"
    run_cell(cell, whole, progress=False)
    expected = [json.loads(line) for line in whole.read_text().splitlines()]
    assert all(r["stats"]["union_size"] > len(small) for r in expected)
    kept = [int(t) for r in expected[:2] for key, ranked in r["recycled"].items() for t in (key, *ranked)]
    assert max(kept) >= len(small)  # union ids past the first tokenizer: a bound of its size would drop the table

    assert_resumed_as_the_run(cell, expected, tmp_path, monkeypatch)
