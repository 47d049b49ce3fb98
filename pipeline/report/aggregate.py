"""Tables and plots from a results directory: every table of ``TABLES`` (CSV, Markdown and HTML under
``tables/``, and ``summary.md``: all of them in one page), the plots (``plots/*.png``, ``pipeline.report.plots``) and
``results.json`` (``pipeline.report.results_file``), from the figures of the grid's cells (``grid.json``) read once
from their files under ``generations/`` (``pipeline.report.figures``).

Every speed-up carries its interval and an unstable cell is marked (docs/speed.md). The speed-up tables are shaped
like the paper's: rows are model set x method, columns datasets; the value is the best over the gamma sweep, with
that gamma in the Markdown. A new table: a shape in ``pipeline.report.tables`` (or an existing one), an entry here
and its caption in ``pipeline.report.captions`` (``CAPTIONS``; shown in the Snakemake report too: ``REPORTED``,
rule aggregate's ``table_report``, then ``python -m pipeline.report.captions``).
"""

from __future__ import annotations

from pathlib import Path

from ..experiment.paths import GENERATIONS, Results
from ..files import ResultsError, write_atomic
from ..measure.speed import SpeedSummary
from . import tables
from .captions import CAPTIONS, PEERS
from .figures import DRAFT_FACTS, RATIOS, Collected, collect, per_cell
from .plots import plot_predicted, plot_speedup_vs_gamma
from .results_file import write_results_file

CELLS_CSV = SpeedSummary.shown("column")  # a cell's figures in cells.csv, in order, after its dimensions
TABLES = [  # (name, shape, metrics or cell columns, title, ...), in summary.md's order; captions: CAPTIONS
    tables.Table("cells", tables.every_figure, CELLS_CSV, files=("csv",), index=()),
    tables.Table("speedup_vs_standard", tables.best, ("speedup_vs_standard",), "Speed-up over the standard method"),
    tables.Table("paper_vs_ours", tables.beside_paper, ("speedup_vs_standard",), "The paper beside ours"),
    tables.Table("ours_vs_peers", tables.over_peers, ("speedup_vs_peer",), "Ours over other engines' methods"),
    tables.Table(
        "ours_vs_vllm", tables.across_engines, ("tokens_per_s_vs_vllm",), "Ours against vLLM, tokens/s (other jobs)"
    ),
    tables.Table(
        "speedup_vs_large",
        tables.best,
        ("speedup_vs_large",),
        "Speed-up over the large model alone, across jobs (not comparable)",
    ),
    tables.Table("quality", tables.by_dataset, ("q:*",), "Quality"),
    tables.Table("likelihood", tables.by_distribution, (), "Quality by log-likelihood, per distribution"),
    tables.Table(
        "acceptance",
        tables.by_cell,
        ("tau", "tau_by_model", "acceptance_rate", "ceiling", "draft_acceptance_rate", "position_acceptance"),
        "Mean accepted length and acceptance",
        keep=lambda d: d["kind"] != "plain",
    ),
    tables.Table(
        "exactness",
        tables.by_cell,
        ("samples", "exact_match", "mismatches_numerics", "mismatches_bug", "mismatches_unchecked"),
        "Exactness at T=0",
        keep=lambda d: d["exact_match"].notna(),
    ),
    tables.Table(
        "predicted_vs_measured",
        tables.by_cell,
        (
            "acceptance_rate",
            "speedup_side_by_side",
            "predicted_speedup",
            "overhead",
            "proposal_cost",
            "union_size",
            "union_map_s",
        ),
        "Predicted vs measured speed-up",
        keep=lambda d: d["predicted_speedup"].notna(),
    ),
    tables.Table(
        "spec_bench_categories",
        tables.by_category,
        ("speedup_side_by_side", "tokens_per_s", "tau"),
        "Spec-Bench by category",
    ),
    tables.Table(
        "drafts",
        tables.distilled,
        ("kind", *DRAFT_FACTS),
        "Proposers: the distilled models",
        index=("model",),
        floatfmt=".3f",
    ),
    tables.Table(
        "beside",
        tables.beside,
        ("cells", "pairs", "interfered", "interfered_share", "cpu_s"),
        "What ran beside the timed pairs",
        index=("process",),
    ),
    tables.Table(
        "flags",
        tables.by_cell,
        ("samples", "pairs_interfered", "pairs_remeasured", "flags"),
        "Flags",
        lambda d: d["unstable"],
        ("id",),
    ),
]


def caption(table: tables.Table, found: Collected) -> str:
    peers = PEERS if found.cells["kind"].eq("peer").any() else ""
    citation = (found.reported or {}).get("citation")
    return CAPTIONS[table.name].format(conf=f"{found.confidence:.0%}", peers=peers, citation=citation)


def aggregate(results: Path, reported: dict | None = None) -> list[Path]:
    """Write every table and plot for ``results`` and its ``results.json``; returns the paths written.
    ``reported``: the paper's figures (default: config/paper_reported.yaml), set beside ours when they name
    this experiment."""
    results = Path(results)
    found = collect(results, reported)
    where = Results(results)
    cells, out, plots = found.cells, where.tables, where.plots
    plots.mkdir(parents=True, exist_ok=True)  # an output of the workflow, also when no plot applies
    if cells.empty:
        raise ResultsError(f"no finished cells under {results / GENERATIONS}")
    unstable = int(cells["unstable"].sum())
    sections = [
        f"# Results of experiment {cells['experiment'].iloc[0]}\n"
        if "experiment" in cells
        else f"# Results: {results}\n",
        f"{len(cells)} cells ({', '.join(sorted(cells['dataset'].unique()))}). Speed is total new tokens over total "
        f"wall time of the cell's samples; every speed-up has its {found.confidence:.0%} interval over prompts "
        f"[low, high] (docs/speed.md, The interval). {unstable} cell{'s are' if unstable != 1 else ' is'} "
        "marked (unstable): see Flags.\n",
    ]
    if found.control.line:
        sections.insert(1, found.control.line + "\n")
    written: list[Path] = []
    for table in TABLES:
        files = tables.render(table, found) or {}
        for name, text in files.items():
            write_atomic(out / name, text)
            written.append(out / name)
        if f"{table.name}.md" in files:
            sections += [f"## {table.title}\n", caption(table, found), files[f"{table.name}.md"]]
    p = plot_speedup_vs_gamma(found, plots / "speedup_vs_gamma.png")
    q = plot_predicted(found, plots / "predicted_vs_measured.png")
    written += [x for x in (p, q) if x]
    sections += [f"![speed-up vs gamma](../plots/{p.name})\n" if p else ""]
    write_atomic(where.summary, "\n".join(s for s in sections if s))
    ratios = per_cell(found, RATIOS)  # what results.json adds to each cell's own records
    ratios.attrs["confidence"] = found.confidence
    return [*written, where.summary, write_results_file(results, ratios, found.records, found.control)]
