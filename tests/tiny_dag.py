"""The tiny DAG, shared by the local and the SLURM workflow tests: its config, a Snakemake run, its tables' checks."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from pipeline.experiment.config import check_config
from pipeline.experiment.grid import expand_cells

ROOT = Path(__file__).resolve().parent.parent


def snakemake(workdir: Path, *args: str, timeout: int = 900, env: dict | None = None) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "snakemake", "-s", str(ROOT / "Snakefile"), "-d", str(workdir), *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)


def said(run: subprocess.CompletedProcess) -> list[str]:
    """A Snakemake run's non-empty output lines after its notice of the profile it read (profiles/default, which
    every local run reads): what the workflow itself said."""
    lines = [line for line in (run.stdout + run.stderr).splitlines() if line.strip()]
    assert lines and lines[0].startswith("Using workflow specific profile"), lines[:3]
    return lines[1:]


def job_counts(output: str) -> dict[str, int]:
    """The 'Job stats' table of a Snakemake run or dry run."""
    table = output.split("Job stats:")[1]
    return {m[1]: int(m[2]) for m in re.finditer(r"^(\w+)\s+(\d+)\s*$", table, re.M) if m[1] != "total"}


def tiny_config(tiny_dir: Path, tiny_dir2: Path, wandb_mode: str = "offline", likelihood: bool = False) -> dict:
    """A target, an identical draft, a third model; 2 HumanEval prompts; 8 cells (6 pairs at T=0, 2 trios at T=1);
    with ``likelihood``, 3 questions of mmlu_mc scored by log-likelihood under the grid's 4 distributions."""
    config = {
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
    if likelihood:
        config["likelihood_tasks"] = {"mmlu_mc": {"limit": 3}}
    return config


def check_tables(results: Path, config: dict) -> None:
    """The tables and plots of a tiny-model run of ``config`` (greedy cells at T=0 with an identical draft among
    them): every cell, lossless greedy cells, speed-ups inside their intervals, every summary section."""
    cells = expand_cells(check_config(config))
    df = pd.read_csv(results / "tables" / "cells.csv", keep_default_na=True)
    assert set(df["id"]) == set(cells)
    assert (df["tokens_per_s"] > 0).all() and (df["samples"] == config["datasets"]["humaneval"]["size"]).all()
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
    assert len(quality) == len(cells)
    low, value, high = (quality[f"humaneval pass@1{k}"] for k in ("_low", "", "_high"))
    assert ((low <= value) & (value <= high) & (high > low)).all()  # every figure with its interval
    assert "[" in (results / "tables" / "quality.md").read_text()
    check_likelihood(results, config)
    for png in ("speedup_vs_gamma.png", "predicted_vs_measured.png"):
        assert (results / "plots" / png).read_bytes()[:4] == b"\x89PNG"
    check_speedup_columns(results)
    check_results_file(results, config)


def check_likelihood(results: Path, config: dict) -> None:
    """The quality-by-log-likelihood table: one row per distinct distribution of the grid, each figure inside its
    interval, the methods it stands for named."""
    if not config.get("likelihood_tasks"):
        assert "_no cells_" in (results / "tables" / "likelihood.md").read_text()
        return
    table = pd.read_csv(results / "tables" / "likelihood.csv").set_index("distribution")
    assert len(table) == 4  # tiny; we and cd of the pair; we of the trio
    assert table.loc["tiny", "methods"] == "large_model (tiny); sd (pair); hf_assisted (pair)"
    assert table.loc["we(weights=0.5/0.5): tiny + tiny-copy", "methods"] == "we (pair); we_se (pair)"
    assert list(table.index)[0] == "tiny"  # in the grid's order
    for metric in ("acc", "acc_norm"):
        name = f"mmlu_mc {metric} (n=3)"
        assert (table[f"{name}_low"] <= table[name]).all() and (table[name] <= table[f"{name}_high"]).all()
    assert "Quality by log-likelihood" in (results / "tables" / "summary.md").read_text()


def check_speedup_columns(results: Path) -> None:
    """The speed-up table's CSV: per dataset the estimate inside its interval, gamma, tau, tokens/s and flags; no
    mean over datasets (Spec-Bench's Overall is its own dataset column)."""
    speed = pd.read_csv(results / "tables" / "speedup_vs_standard.csv").set_index(["model_set", "method", "T"])
    for column in ("low", "high", "gamma", "tau", "tokens_per_s", "unstable", "flags"):
        assert f"humaneval_{column}" in speed.columns
    bounded = speed.dropna(subset=["humaneval_low"])
    assert len(bounded) and (bounded["humaneval_low"] <= bounded["humaneval"]).all()
    assert (bounded["humaneval"] <= bounded["humaneval_high"]).all()
    assert not [c for c in speed.columns if c.startswith("Overall")]
    cells = pd.read_csv(results / "tables" / "cells.csv").set_index("id")
    sd = cells.loc["humaneval/pair/sd-T0-g2"]
    row = speed.loc[("pair", "sd", 0)]
    assert row["humaneval_tau"] == pytest.approx(sd["tau"]) and str(row["humaneval_gamma"]) == "2"
    assert row["humaneval_tokens_per_s"] == pytest.approx(sd["tokens_per_s"])


def check_results_file(results: Path, config: dict) -> None:
    """results.json: every cell's speed as its speed record has it, its quality under the metric's name, its
    config as the cell file has it; versions, the git commit, the machine."""
    doc = json.loads((results / "results.json").read_text())
    cells = expand_cells(check_config(config))
    assert doc["experiment"] == config["experiment"]
    by_id = {c["id"]: c for c in doc["cells"]}
    assert set(by_id) == set(cells)
    for cell_id, record in by_id.items():
        base = results / "generations" / f"{cell_id}.jsonl"
        speed = json.loads(base.with_suffix(".speed.json").read_text())
        for key in ("tokens_per_s", "tau", "speedup_side_by_side", "speedup_ci_low", "speedup_ci_high", "flags"):
            assert record["speed"][key] == speed.get(key), (cell_id, key)
        assert record["speed"]["unstable"] is speed["unstable"]
        quality = json.loads(base.with_suffix(".summary.json").read_text())
        assert record["quality"]["pass@1"] == quality["pass@1"] and record["quality"]["task"] == "humaneval"
        assert record["config"] == json.loads((results / "cells" / f"{cell_id}.json").read_text())["cell"]
        assert record["dims"]["id"] == cell_id
    spec = by_id["humaneval/pair/sd-T0-g2"]["speed"]
    assert spec["speedup_ci_low"] <= spec["speedup_side_by_side"] <= spec["speedup_ci_high"]
    assert all(doc["versions"][name] for name in ("torch", "transformers", "snakemake", "lm_eval", "wandb"))
    assert re.fullmatch(r"[0-9a-f]{40}", doc["git"]["commit"]) and isinstance(doc["git"]["dirty"], bool)
    assert doc["machine"]["platform"] and doc["machine"]["cpu_count"] >= 1 and isinstance(doc["machine"]["gpus"], list)


REPORT_VIEW = """<script>
setTimeout(function () {  // open the speed-up table's entry (its caption holds the table) and show a plot
  const find = (end) => Object.keys(results).find((k) => k.endsWith(end));
  const table = find("speedup_vs_standard.html"), plot = find("speedup_vs_gamma.png");
  app.setView({navbarMode: "resultinfo", resultPath: table, content: "img", contentPath: results[plot].data_uri});
}, 500);
</script>"""


def chromium() -> str:
    """The Chromium binary (installed by `make install`, scripts/install-chromium.sh); skips the test without it."""
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if not found:
        pytest.skip("chromium is not installed and could not be installed here (scripts/install-chromium.sh)")
    return found


def check_report(workdir: Path, configfile: Path, out: Path) -> tuple[str, Path]:
    """`snakemake --report` on a finished run, rendered in headless Chromium with the speed-up table's entry and
    a plot open: returns the rendered DOM and a screenshot; checks the table's text and the plot are there."""
    browser = chromium()
    run = snakemake(workdir, "--configfile", str(configfile), "--report", str(out / "report.html"))
    assert run.returncode == 0, (run.stdout + run.stderr)[-3000:]
    html = (out / "report.html").read_text()
    for name in ("speedup_vs_standard.html", "results.json", "speedup_vs_gamma.png", "predicted_vs_measured.png"):
        assert name in html
    shown = out / "shown.html"
    end = html.rindex("</body>")
    shown.write_text(html[:end] + REPORT_VIEW + html[end:])
    args = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--virtual-time-budget=5000"]
    dom = subprocess.run([*args, "--dump-dom", shown.as_uri()], capture_output=True, text=True, timeout=120).stdout
    png = out / "report.png"
    subprocess.run(
        [*args, "--window-size=1400,900", f"--screenshot={png}", shown.as_uri()], capture_output=True, timeout=120
    )
    app = dom[dom.index('<div id="app">') :]
    app = app[: app.index("<script")]  # what the page shows, not the report's data
    # the speed-up table, rendered from its caption: a row of the table with its figure and interval
    assert re.search(r"<th>sd</th>.*?\d\.\d\dx \[\d\.\d\d, \d\.\d\d\]", app, re.S), app[-2000:]
    assert "no mean over them" in app and "Speed-up over the standard method" in app
    assert re.search(r'<img src="data:image/png[^"]*filename=speedup_vs_gamma\.png', app)
    return dom, png
