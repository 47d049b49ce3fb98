"""The aggregate step's long frame of figures (one row per cell, metric and category, with its interval) and the
declared tables rendered from it."""

from __future__ import annotations

import json
import re
import types
from html import unescape
from pathlib import Path

import pytest

from pipeline.report.aggregate import TABLES
from pipeline.report.figures import FIGURE, collect
from pipeline.report.tables import render

WE, SE = "d/s/we-T0", "d/s/we_se-T0-g2"
TABLE = {t.name: t for t in TABLES}


def two_cells(root: Path) -> Path:
    """A results tree of an ensemble and its speculative ensemble (Spec-Bench categories, a τ per model)."""
    results = root / "results"
    (results / "generations" / "d" / "s").mkdir(parents=True)
    dims = {"experiment": "x", "grid": "g", "model_set": "s", "models": ["a", "b"], "large_model": "a", "family": "we"}
    dims |= {"dataset": "d", "temperature": 0.0, "standard": "we"}
    grid = [
        {"id": WE, **dims, "method": "we", "kind": "plain", "gamma": None},
        {"id": SE, **dims, "method": "we_se", "kind": "se", "gamma": "2"},
    ]
    (results / "grid.json").write_text(json.dumps(grid))
    speed = {"samples": 4, "tokens_per_s": 20.0, "unstable": False, "flags": [], "tau_by_model": [2.5, None]}
    speed |= {"speedup_side_by_side": 1.5, "speedup_ci_low": 1.4, "speedup_ci_high": 1.6, "tau": 2.5}
    speed |= {"pairs_interfered": 1, "beside": {"pipeline speed": {"pairs": 2, "interfered": 1, "cpu_s": 0.5}}}
    speed["by_category"] = {
        "writing": {"tokens_per_s": 30.0, "speedup_side_by_side": 1.5, "speedup_ci_low": 1.2, "speedup_ci_high": 1.8},
        "math": {"tokens_per_s": 12.5, "tau": 2.0},
    }
    plain = {"samples": 4, "tokens_per_s": 13.0, "unstable": False, "flags": []}
    for cell, record in ((WE, plain), (SE, speed)):
        (results / "generations" / f"{cell}.jsonl").write_text("")
        (results / "generations" / f"{cell}.speed.json").write_text(json.dumps(record))
    (results / "models").mkdir()
    head = {"kind": "feature_head", "teacher": "a", "recipe": {"loss": "kl"}, "steps": 800, "agreement": 0.41}
    (results / "models" / "a.json").write_text(json.dumps({"name": "a", "parameters": 9, "feature_head": head}))
    draft = {"teacher": "a", "recipe": {"loss": "kl", "steps": 400}, "steps": 400, "agreement": 0.204}
    draft |= {"agreement_with_lookup": 0.69, "acceptance_t1": 0.203, "acceptance_t1_with_lookup": 0.644}
    draft |= {"eval_tokens": 1536, "threads": 2, "train_seconds": 33.0, "total_seconds": 151.2, "final_loss": 0.79}
    (results / "models" / "b.json").write_text(json.dumps({"name": "b", "distilled": draft}))
    return results


def test_the_long_frame_holds_each_figure_once_with_its_interval(tmp_path):
    found = collect(two_cells(tmp_path), reported={})
    assert list(found.figures.columns) == FIGURE
    figures = found.figures.set_index(["cell", "metric", "category"])
    assert figures.index.is_unique
    assert figures.loc[(SE, "speedup_side_by_side", ""), ["value", "low", "high"]].tolist() == [1.5, 1.4, 1.6]
    assert figures.loc[(SE, "speedup_side_by_side", "writing"), ["low", "high"]].tolist() == [1.2, 1.8]
    assert (SE, "speedup_side_by_side", "math") not in figures.index  # no speed-up measured for it
    assert figures.loc[(SE, "tokens_per_s", "math"), "value"] == 12.5
    assert (
        figures.loc[(SE, "tau_by_model", "1"), "value"] == 2.5
        and figures.loc[(SE, "tau_by_model", "2"), "value"] is None
    )
    assert figures.loc[(SE, "samples", ""), "value"] == 4 and isinstance(figures.loc[(SE, "samples", ""), "value"], int)
    assert figures.loc[(SE, "speedup_vs_standard", ""), ["value", "low", "high"]].tolist() == [1.5, 1.4, 1.6]
    assert figures.loc[(WE, "speedup_vs_standard", ""), "value"] == 1.0  # an ensemble is its own standard
    assert not [m for m in found.figures["metric"] if ":" in m and not m.startswith("q:")]  # no names within names
    assert list(found.cells["id"]) == [WE, SE] and list(found.cells["T"]) == ["0", "0"]


def test_a_speed_record_with_a_key_its_type_does_not_know_is_one_line_naming_the_file(tmp_path):
    """The aggregate reads each .speed.json through SpeedSummary: a record from another version (a key renamed)
    stops with one line naming the file, never a table silently missing a figure."""
    from pipeline.files import ResultsError

    results = two_cells(tmp_path)
    path = results / "generations" / f"{SE}.speed.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "speedup": 1.5}))
    with pytest.raises(ResultsError, match=r"the speed record .*we_se-T0-g2.speed.json: .*'speedup' was unexpected"):
        collect(results, reported={})
    path.write_text(json.dumps({**json.loads(path.read_text()), "speedup": None, "tau": "fast"}))  # another type
    del_key = json.loads(path.read_text())
    del del_key["speedup"]
    path.write_text(json.dumps(del_key))
    with pytest.raises(ResultsError, match=r"the speed record .*we_se-T0-g2.speed.json: tau=\"fast\" is not accepted"):
        collect(results, reported={})


def test_a_declared_table_shows_the_figures_of_the_frame(tmp_path):
    found = collect(two_cells(tmp_path), reported={})
    files = render(TABLE["speedup_vs_standard"], found)
    assert set(files) == {"speedup_vs_standard.csv", "speedup_vs_standard.md", "speedup_vs_standard.html"}
    assert "1.50x [1.40, 1.60] (γ=2)" in files["speedup_vs_standard.md"]
    ratio = (found.figures["cell"] == SE) & (found.figures["metric"] == "speedup_vs_standard")
    found.figures.loc[ratio, ["low", "high"]] = [1.55, 1.9]  # a planted interval, not around its estimate
    files = render(TABLE["speedup_vs_standard"], found)
    assert "1.50x [1.55, 1.90] (γ=2)" in files["speedup_vs_standard.md"]
    assert "1.50x [1.55, 1.90] (γ=2)" in files["speedup_vs_standard.html"]
    assert "s,we_se,0,1.5,1.55,1.9,2," in files["speedup_vs_standard.csv"]

    categories = render(TABLE["spec_bench_categories"], found)["spec_bench_categories.md"]
    row = next(line for line in categories.splitlines() if "we_se" in line)
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[-3:] == [
        "12.5 tok/s, τ 2.00",
        "1.50x [1.20, 1.80]",
        "1.50x [1.40, 1.60], τ 2.50",
    ]  # math, writing, Overall
    assert "2.50 -" in render(TABLE["acceptance"], found)["acceptance.md"]  # τ per model, the second missing
    assert render(TABLE["ours_vs_peers"], found) is None  # no peers: the table is left out
    assert render(TABLE["paper_vs_ours"], found) is None  # the paper names another experiment
    assert set(render(TABLE["cells"], found)) == {"cells.csv"}


@pytest.mark.parametrize("name", [t.name for t in TABLES])
def test_every_declared_table_renders_its_files(tmp_path, name):
    found = collect(two_cells(tmp_path), reported={"experiment": "x", "citation": "c", "figures": []})
    files = render(TABLE[name], found)
    other_engines = ("ours_vs_peers", "ours_vs_vllm")  # no peers: these tables are left out
    assert files is None and name in other_engines or set(files) == {f"{name}.{k}" for k in TABLE[name].files}


def test_the_beside_table_ranks_what_ran_beside_the_timed_runs_under_every_timed_sample(tmp_path):
    found = collect(two_cells(tmp_path))
    md = render(TABLE["beside"], found)["beside.md"].splitlines()
    rows = [[c.strip() for c in line.split("|")[1:-1]] for line in md[2:]]
    assert rows == [
        ["(every timed sample)", "1", "4", "1", "25%", "-"],
        ["pipeline speed", "1", "2", "1", "50%", "0.5"],
    ]
    # a cell derived from another's side-by-side runs (samples_from) holds its source's timed runs: counted once
    grid = json.loads((tmp_path / "results" / "grid.json").read_text())
    grid[0]["samples_from"] = SE
    (tmp_path / "results" / "grid.json").write_text(json.dumps(grid))
    speed = tmp_path / "results" / "generations" / f"{WE}.speed.json"
    beside = {"pipeline speed": {"pairs": 2, "interfered": 0, "cpu_s": 0.2}}
    speed.write_text(json.dumps({**json.loads(speed.read_text()), "beside": beside}))
    md = render(TABLE["beside"], collect(tmp_path / "results"))["beside.md"].splitlines()
    assert [[c.strip() for c in line.split("|")[1:-1]] for line in md[2:]] == rows


def test_the_drafts_table_says_how_each_proposer_was_trained(tmp_path):
    found = collect(two_cells(tmp_path))
    md = render(TABLE["drafts"], found)["drafts.md"]
    header = md.splitlines()[0]
    assert [c.strip() for c in header.strip("|").split("|")][:5] == ["model", "kind", "teacher", "loss", "steps"]
    eagle, row = md.splitlines()[2:4]
    assert eagle.split("|")[1].strip() == "a (eagle)" and "feature_head" in eagle and "0.410" in eagle
    assert row.split("|")[1].strip() == "b" and "| kl " in row and "0.20" in row and "1536" in row
    assert "agreement_prefix" not in header  # a draft's table has no student column
    for name in ("a", "b"):
        (tmp_path / "results" / "models" / f"{name}.json").write_text("{not json")
    assert render(TABLE["drafts"], collect(tmp_path / "results")) is None  # no distilled model: no table


@pytest.mark.parametrize("damage", [b"", b"{not json", b"[1, 2]", b"\xff\xfe"])
def test_a_damaged_speed_record_stops_the_aggregate_in_one_line(tmp_path, capsys, damage):
    from pipeline.cli import main

    results = two_cells(tmp_path)
    speed = results / "generations" / f"{SE}.speed.json"
    speed.write_bytes(damage)
    assert main(["aggregate", str(results)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"the speed record {speed}" in err[0], err


def test_the_reports_captions_are_generated_from_the_tables_captions_and_render(monkeypatch):
    """Each table's caption is written once (report/captions.py); the Snakemake report's captions are generated
    from it, render as reStructuredText without a warning, and state the config's confidence."""
    import jinja2
    from docutils.core import publish_parts

    from pipeline.report import captions

    assert captions.main(["--check"]) == 0, "run python -m pipeline.report.captions"
    rule = (captions.ROOT / "workflow" / "rules" / "aggregate.smk").read_text()
    assert re.findall(r'table_report\("(\w+)"', rule) == list(captions.REPORTED)  # the report's tables, each captioned
    template = (captions.REPORT_DIR / "speedup_vs_standard.rst").read_text()
    for config, shown in (({}, "95% interval"), ({"timing": {"confidence": 0.9}}, "90% interval")):
        snakemake = types.SimpleNamespace(config=config, output=types.SimpleNamespace(speedup_html="t.html"))
        text = jinja2.Template(template).render(snakemake=snakemake)
        assert shown in text and ":file: t.html" in text
    for name in captions.REPORTED:
        text = (captions.REPORT_DIR / f"{name}.rst").read_text().split("\n.. raw::")[0]
        settings = {"report_level": 2, "halt_level": 2}  # a warning raises
        rendered = jinja2.Template(text).render(snakemake=snakemake)
        html = publish_parts(rendered, writer_name="html", settings_overrides=settings)
        assert "<p>" in html["body"] and "``" not in html["body"]
    monkeypatch.setitem(captions.CAPTIONS, "flags", "Another caption.\n")
    assert captions.main(["--check"]) == 1


def with_null(root: Path, low: float, high: float) -> Path:
    """``two_cells`` and the run's null cell (the large model against itself) whose interval is [low, high]."""
    results = two_cells(root)
    grid = json.loads((results / "grid.json").read_text())
    null = {**grid[0], "id": "d/a/large_model-T0-null", "method": "large_model", "kind": "plain", "gamma": None}
    null |= {"model_set": "a", "models": ["a"], "standard": "large_model", "control": "null"}
    (results / "grid.json").write_text(json.dumps([*grid, null]))
    speed = {"samples": 10, "tokens_per_s": 20.0, "unstable": False, "flags": [], "tau": 1.0}
    speed |= {"speedup_side_by_side": (low + high) / 2, "speedup_ci_low": low, "speedup_ci_high": high}
    (results / "generations" / "d" / "a").mkdir()
    (results / "generations" / f"{null['id']}.jsonl").write_text("")
    (results / "generations" / f"{null['id']}.speed.json").write_text(json.dumps(speed))
    return results


def test_a_null_cell_whose_interval_misses_one_flags_the_whole_run_in_one_line(tmp_path):
    """The run's control (report/control.py): a planted null at 0.97x [0.95, 0.99] puts one line above every table
    a person reads (Markdown and HTML), at the top of summary.md and in results.json; a null that covers 1.00
    puts it nowhere."""
    from pipeline.report.aggregate import aggregate

    results = with_null(tmp_path / "missed", 0.95, 0.99)
    written = aggregate(results, reported={})
    line = "Control missed: this run's null cell (the large model timed against itself) reads 0.97x [0.95, 0.99]"
    shown = [p for p in written if p.suffix in (".md", ".html")]
    assert len(shown) > 10
    for path in shown:
        head = unescape(path.read_text().split("<h3>")[0]) if path.suffix == ".html" else path.read_text()[:600]
        assert line in head, path
    assert (results / "tables" / "summary.md").read_text().count(line) == 1 + sum(
        1 for p in shown if p.suffix == ".md" and p.name != "summary.md"
    )  # its own line, and each table's
    control = json.loads((results / "results.json").read_text())["control"]
    assert control["covers"] is False and control["line"].strip("*").startswith(line)
    assert control["cell"] == "d/a/large_model-T0-null" and control["low"] == 0.95
    from pipeline.experiment.paths import Results
    from pipeline.report.tracking import _log_tables

    run = types.SimpleNamespace(log=lambda *a, **k: None, summary={})  # the experiment's W&B run, as it is filled
    _log_tables(Results(results), run)
    assert run.summary["control/covers"] is False and run.summary["control/line"] == control["line"]

    results = with_null(tmp_path / "covered", 0.98, 1.02)
    aggregate(results, reported={})
    assert "Control missed" not in (results / "tables" / "summary.md").read_text()
    assert not [p for p in (results / "tables").glob("*.html") if "Control missed" in p.read_text()]
    control = json.loads((results / "results.json").read_text())["control"]
    assert control["covers"] is True and control["line"] is None


def test_the_cross_job_table_is_labelled_not_comparable_with_the_nulls_reading_beside(tmp_path):
    """speedup_vs_large compares different jobs: its title says it is not comparable, and its caption says the
    null row measures the drift between jobs."""
    from pipeline.report.aggregate import aggregate

    results = two_cells(tmp_path)
    aggregate(results, reported={})
    summary = (results / "tables" / "summary.md").read_text()
    assert "## Speed-up over the large model alone, across jobs (not comparable)" in summary
    caption = summary.split("## Speed-up over the large model alone")[1].split("\n\n")[1]
    assert caption.startswith("Not comparable:") and "The null row measures that drift" in caption
