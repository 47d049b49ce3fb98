"""What a researcher publishes from: a speed-up table's columns (one per dataset, no mean over them), the paper
beside ours, config/README.md and the workflow catalog's file (results.json and the report: tests/tiny_dag.py,
on the tiny DAG's results)."""

from __future__ import annotations

import pandas as pd
import yaml

from pipeline.experiment import config_doc
from pipeline.report.results_file import load_reported, paper_vs_ours
from tests.tiny_dag import ROOT


def speed_table() -> pd.DataFrame:
    rows = [
        ("pair", "we_se", "1", 1.30, 1.20, 1.40, 0.90, 0.85, 0.95),
        ("pair", "we_sd", "1", 1.05, 1.00, 1.10, 1.00, 0.95, 1.05),
    ]
    columns = ["model_set", "method", "T", "humaneval", "humaneval_low", "humaneval_high"]
    columns += ["gsm8k", "gsm8k_low", "gsm8k_high"]
    return pd.DataFrame(rows, columns=columns).set_index(["model_set", "method", "T"])


def test_the_paper_beside_ours_matches_figures_by_method_set_and_dataset():
    reported = {
        "figures": [
            {"method": "*_se", "low": 1.11, "high": 2.23, "source": "Abstract"},
            {"method": "we_se", "model_set": "pair", "T": "1", "dataset": "humaneval", "speedup": 1.35, "source": "T1"},
            {"method": "we_se", "model_set": "other", "dataset": "humaneval", "speedup": 2.0, "source": "T1"},
        ]
    }
    table = paper_vs_ours(speed_table(), reported).reset_index()
    assert set(table["method"]) == {"we_se"}  # *_se: no we_sd row
    ranged = table[table["paper_source"] == "Abstract"].set_index("dataset")
    assert ranged.loc["humaneval", "ours_in_paper_range"] and not ranged.loc["gsm8k", "ours_in_paper_range"]
    assert ranged["paper"].isna().all()
    single = table[table["paper_source"] == "T1"]
    assert len(single) == 1  # the other model set's figure matches nothing of ours
    assert single["paper_in_our_interval"].item() and single["ours"].item() == 1.30
    reported["figures"][1]["speedup"] = 1.5
    again = paper_vs_ours(speed_table(), reported).reset_index()
    assert not again[again["paper_source"] == "T1"]["paper_in_our_interval"].item()  # 1.5 outside [1.20, 1.40]


def test_the_papers_figures_file_cites_the_paper_and_says_where_each_figure_is():
    reported = load_reported()
    assert reported["experiment"] == yaml.safe_load((ROOT / "config" / "paper.yaml").read_text())["experiment"]
    assert "2502.01662" in reported["citation"]
    for figure in reported["figures"]:
        assert figure["source"] and figure["method"]
        assert "speedup" in figure or figure["low"] <= figure["high"]


def test_config_readme_is_generated_from_the_schema():
    assert (ROOT / "config" / "README.md").read_text() == config_doc.render_page(), (
        "run python -m pipeline.experiment.config_doc"
    )
    text = config_doc.render_page()
    schema = yaml.safe_load(config_doc.SCHEMA.read_text())
    for key in schema["properties"]:
        assert f"| `{key}` |" in text
    assert "| `timing.confidence` | number | 0.95 | of the speed-up intervals |" in text
    assert "| `grids[].model_sets` | object |" in text and "| `models.<name>.runner` |" in text
    assert config_doc.main(["--check"]) == 0


def test_the_workflow_catalog_file_has_the_catalogs_keys():
    catalog = yaml.safe_load((ROOT / ".snakemake-workflow-catalog.yml").read_text())
    usage = catalog["usage"]
    assert set(usage) == {"mandatory-flags", "software-stack-deployment", "report"}
    assert usage["report"] is True and usage["mandatory-flags"]["desc"]
    assert set(usage["software-stack-deployment"]) == {"conda", "apptainer", "apptainer+conda"}
    assert (ROOT / "config" / "README.md").exists()


def test_the_speedup_csv_has_each_datasets_columns_and_no_mean_over_them():
    from pipeline.report.tables import PER_DATASET
    from pipeline.report.tables import speedup_numbers as numbers

    best = pd.DataFrame(
        {
            "model_set": ["pair"] * 3,
            "method": ["we_se"] * 3,
            "T": ["1"] * 3,
            "dataset": ["gsm8k", "humaneval", "mmlu"],
            "speedup_vs_standard": [1.2, 1.6, float("nan")],
            "speedup_vs_standard_low": [1.1, 1.3, float("nan")],
            "speedup_vs_standard_high": [1.3, 1.8, float("nan")],
            "gamma": ["1-3", "1-3", "1-3"],
            "tau": [2.0, 2.5, 1.5],
            "tokens_per_s": [10.0, 12.0, 9.0],
            "speedup_vs_standard_unstable": [False, True, False],
            "flags": ["", "interval too wide", ""],
        }
    ).set_index(["model_set", "method", "T", "dataset"])
    row = numbers(best, "speedup_vs_standard").loc[("pair", "we_se", "1")]
    assert list(row.index[:8]) == [f"gsm8k{s}" for s in ("", "_low", "_high", "_gamma", "_tau", "_tokens_per_s")] + [
        "gsm8k_unstable",
        "gsm8k_flags",
    ]
    assert row["humaneval_tau"] == 2.5 and row["humaneval_flags"] == "interval too wide"
    # no mean over different benchmarks: Spec-Bench's Overall is the spec_bench column itself (its prompts pooled)
    assert not [c for c in row.index if c.startswith("Overall")]
    assert len(row.index) == 3 * len(PER_DATASET)
