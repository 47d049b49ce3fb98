"""The decoder as an lm-eval model, on the local task YAMLs, offline."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
REPO = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(not DATA.is_dir(), reason="needs the shared benchmark data")
@pytest.mark.parametrize(
    "task,metric", [("gsm8k_local", "exact_match,strict-match"), ("humaneval_local", "pass@1,none")]
)
def test_lm_eval_generates_through_the_decoder(tiny_dir, tmp_path, monkeypatch, task, metric):
    from pipeline.cli import main

    monkeypatch.setenv("SPECENS_DATA_DIR", str(DATA))
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    model_args = f"method=we_se,models=a={tiny_dir}+b={tiny_dir},gamma=1+2,lambda=0.5,max_gen_toks=8"
    out = tmp_path / "out"
    assert (
        main(
            [
                "lm-eval",
                "--model",
                "specens",
                "--model_args",
                model_args,
                "--tasks",
                task,
                "--include_path",
                str(REPO / "tasks" / "lm_eval"),
                "--limit",
                "2",
                "--output_path",
                str(out),
            ]
        )
        == 0
    )
    results = json.loads(next(out.rglob("results_*.json")).read_text())["results"][task]
    assert 0.0 <= results[metric] <= 1.0
