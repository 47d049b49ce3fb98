"""The generation job: per-sample records, resume after a crash, side-by-side baseline."""

from __future__ import annotations

import json

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
