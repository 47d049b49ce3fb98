"""The tiny DAG, shared by the local and the SLURM workflow tests: its config, a Snakemake run, its tables' checks."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from pipeline.workflow import check_config, expand_cells

ROOT = Path(__file__).resolve().parent.parent


def snakemake(workdir: Path, *args: str, timeout: int = 900, env: dict | None = None) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "snakemake", "-s", str(ROOT / "Snakefile"), "-d", str(workdir), *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)


def job_counts(output: str) -> dict[str, int]:
    """The 'Job stats' table of a Snakemake run or dry run."""
    table = output.split("Job stats:")[1]
    return {m[1]: int(m[2]) for m in re.finditer(r"^(\w+)\s+(\d+)\s*$", table, re.M) if m[1] != "total"}


def tiny_config(tiny_dir: Path, tiny_dir2: Path, wandb_mode: str = "offline") -> dict:
    """A target, an identical draft, a third model; 2 HumanEval prompts; 8 cells (6 pairs at T=0, 2 trios at T=1)."""
    return {
        "experiment": "tiny",
        "models": {
            "tiny": {"source": str(tiny_dir)},
            "tiny-copy": {"source": str(tiny_dir)},
            "tiny-third": {"source": str(tiny_dir2)},
        },
        "grids": [
            {
                "name": "pairs",
                "model_sets": {"pair": ["tiny", "tiny-copy"]},
                "methods": ["large_model", "sd", "we", "we_se", "cd_se", "hf_assisted"],
                "method_args": {"lambda": 0.5, "alpha": 0.1},
            },
            {
                "name": "trio",
                "model_sets": {"trio": ["tiny", "tiny-copy", "tiny-third"]},
                "methods": ["we", "we_se"],
                "temperature": [1.0],
            },
        ],
        "datasets": {"humaneval": {"size": 2}},
        "gamma": [2],
        "max_new_tokens": 5,
        "threads": 1,
        "wandb": {"mode": wandb_mode, "project": "specens-test"},
    }


def check_tables(results: Path, config: dict) -> None:
    """The tables and plots of a tiny-model run of ``config`` (greedy cells at T=0 with an identical draft among
    them): every cell, lossless greedy cells, speed-ups inside their intervals, every summary section."""
    cells = expand_cells(check_config(config))
    df = pd.read_csv(results / "tables" / "cells.csv", keep_default_na=True)
    assert set(df["id"]) == set(cells)
    assert (df["tokens_per_s"] > 0).all() and (df["samples"] == 2).all()
    spec = df[df["kind"] != "plain"].set_index("id")
    assert spec["speedup_side_by_side"].notna().all() and spec["predicted_speedup"].gt(0).all()
    greedy = spec[spec["temperature"] == 0]
    assert (greedy["exact_match"] == 1.0).all()  # lossless: each method emits its baseline's tokens
    assert (greedy["mismatches_bug"] == 0).all()
    # the draft is an exact copy of the target: nearly every proposal is accepted
    sd = spec.loc["humaneval/pair/sd-T0-g2"]
    assert sd["acceptance_rate"] > 0.9 and sd["tau"] > 2.0  # gamma 2, all accepted: up to 3 tokens per forward
    assert (spec["speedup_ci_low"] <= spec["speedup_side_by_side"]).all()
    assert (spec["speedup_side_by_side"] <= spec["speedup_ci_high"]).all()
    assert df.set_index("id").loc["humaneval/tiny/large_model-T0", "speedup_vs_large"] == pytest.approx(1.0)
    assert df["q:pass@1"].between(0, 1).all()

    speed = pd.read_csv(results / "tables" / "speedup_vs_standard.csv")
    assert "sd" in set(speed["method"])
    assert speed["humaneval"].gt(0).all()
    md = (results / "tables" / "speedup_vs_large.md").read_text()
    for method in set(greedy["method"]) | {"large_model"}:
        assert f"| {method} " in md
    summary = (results / "tables" / "summary.md").read_text()
    for section in (
        "over the standard method",
        "over the large model",
        "Quality",
        "Mean accepted length",
        "Predicted",
        "Exactness",
        "Flags",
    ):
        assert section in summary
    quality = pd.read_csv(results / "tables" / "quality.csv")
    assert "humaneval" in quality.columns and len(quality) == len(cells)
    for png in ("speedup_vs_gamma.png", "predicted_vs_measured.png"):
        assert (results / "plots" / png).read_bytes()[:4] == b"\x89PNG"
