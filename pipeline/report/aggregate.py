"""Tables and plots from a results directory: every table of ``TABLES`` (CSV, Markdown and HTML under
``tables/``, and ``summary.md``: all of them in one page), the plots (``plots/*.png``, ``pipeline.report.plots``) and
``results.json`` (``pipeline.report.results_file``), from the figures of the grid's cells (``grid.json``) read once
from their files under ``generations/`` (``pipeline.report.figures``).

Every speed-up carries its interval and an unstable cell is marked (docs/speed.md). The speed-up tables are shaped
like the paper's: rows are model set x method, columns datasets; the value is the best over the gamma sweep, with
that gamma in the Markdown. A new table: a layout in ``pipeline.report.tables`` (or an existing one), an entry here.
"""

from __future__ import annotations

from pathlib import Path

from ..files import ResultsError, write_atomic
from . import tables as layout
from .figures import DRAFT_FACTS, RATIOS, Collected, collect, per_cell
from .plots import plot_predicted, plot_speedup_vs_gamma
from .results_file import write_results_file
from .tables import OVERALL_NOTE

CELLS_CSV = (  # a cell's figures in cells.csv, in order, after its dimensions
    "samples new_tokens tokens_per_s baseline_tokens_per_s speedup_side_by_side speedup_ci_low speedup_ci_high tau "
    "tau_by_model acceptance_rate draft_acceptance_rate position_acceptance predicted_speedup exact_match "
    "mismatches_numerics mismatches_bug mismatches_unchecked pairs_interfered pairs_remeasured overhead union_size "
    "union_map_s unstable flags"
)
TABLES = [  # (name, layout, metrics or cell columns, title, ...), in summary.md's order; captions: CAPTIONS
    layout.Table("cells", layout.every_figure, tuple(CELLS_CSV.split()), files=("csv",), index=()),
    layout.Table("speedup_vs_standard", layout.best, ("speedup_vs_standard",), "Speed-up over the standard method"),
    layout.Table("paper_vs_ours", layout.beside_paper, ("speedup_vs_standard",), "The paper beside ours"),
    layout.Table("ours_vs_peers", layout.over_peers, ("speedup_vs_peer",), "Ours over transformers' methods"),
    layout.Table("speedup_vs_large", layout.best, ("speedup_vs_large",), "Speed-up over the large model alone"),
    layout.Table("quality", layout.by_dataset, ("q:*",), "Quality"),
    layout.Table("likelihood", layout.by_distribution, (), "Quality by log-likelihood, per distribution"),
    layout.Table(
        "acceptance",
        layout.by_cell,
        ("tau", "tau_by_model", "acceptance_rate", "draft_acceptance_rate", "position_acceptance"),
        "Mean accepted length and acceptance",
        keep=lambda d: d["kind"] != "plain",
    ),
    layout.Table(
        "exactness",
        layout.by_cell,
        ("samples", "exact_match", "mismatches_numerics", "mismatches_bug", "mismatches_unchecked"),
        "Exactness at T=0",
        keep=lambda d: d["exact_match"].notna(),
    ),
    layout.Table(
        "predicted_vs_measured",
        layout.by_cell,
        ("acceptance_rate", "speedup_side_by_side", "predicted_speedup", "overhead", "union_size", "union_map_s"),
        "Predicted vs measured speed-up",
        keep=lambda d: d["predicted_speedup"].notna(),
    ),
    layout.Table(
        "spec_bench_categories",
        layout.by_category,
        ("speedup_side_by_side", "tokens_per_s", "tau"),
        "Spec-Bench by category",
    ),
    layout.Table(
        "drafts",
        layout.distilled,
        ("kind", *DRAFT_FACTS),
        "Proposers: the distilled models",
        index=("model",),
        floatfmt=".3f",
    ),
    layout.Table(
        "beside",
        layout.beside,
        ("cells", "pairs", "interfered", "interfered_share", "cpu_s"),
        "What ran beside the timed pairs",
        index=("process",),
    ),
    layout.Table(
        "flags",
        layout.by_cell,
        ("samples", "pairs_interfered", "pairs_remeasured", "flags"),
        "Flags",
        lambda d: d["unstable"],
        ("id",),
    ),
]
PEERS = (  # the speed-up table's caption, when the grid has transformers' own methods
    "`hf_*`: transformers' own `generate` (assisted generation, prompt lookup, `assistant_ensemble_weight`) "
    "with the model set's draft and the same gamma; transformers cannot take a restricted head, so they "
    "run on a set with a full-head draft, and the table's other rows of that set use the same draft.\n"
)
CAPTIONS = {  # {conf}: the speed-ups' confidence
    "speedup_vs_standard": (
        "Tokens/s over the cell's standard method (the ensemble for `*_sd`/`*_se`, the large model for `sd`), "
        "measured side by side in the same job; best over the gamma sweep (the best of several noisy estimates "
        "leans high: read the interval); {conf} interval in brackets. " + OVERALL_NOTE + "{peers}"
    ),
    "paper_vs_ours": (
        "The speed-ups {citation} reports (config/paper_reported.yaml, with where each is stated) "
        "beside ours over the standard method [{conf} interval]; a figure not transcribed stays empty.\n"
    ),
    "ours_vs_peers": (
        "Ours over transformers' own methods: each cell's side-by-side speed-up over its standard method "
        "divided by the peer's, prompts paired ({conf} paired-bootstrap interval); `hf_assisted_ensemble` "
        "is not the weighted ensemble's distribution (docs/exactness.md).\n"
    ),
    "speedup_vs_large": "Tokens/s over the large model's own cell (another job; prompts paired by id). " + OVERALL_NOTE,
    "quality": (
        "Every task metric of each cell's outputs, under its own name (pass@1, acc, ...), with its 95% interval "
        "over examples [low, high]: Wilson's for a proportion, else a bootstrap (docs/quality.md). Intervals "
        "that overlap read as no significant difference.\n"
    ),
    "likelihood": (
        "Multiple-choice tasks scored by log-likelihood through lm-eval, once per distinct distribution rather "
        "than per cell: a lossless accelerated method (`sd`, `*_sd`, `*_se`, `*_me`, the peers) draws from its "
        "standard method's distribution and shares its figures (methods: the cells it stands for); scored at "
        "temperature 1 whatever the cells' T. acc: the answer with the highest log-likelihood; acc_norm: per "
        "character; n questions; 95% Wilson interval [low, high]. `- large`: an ensemble's figure minus its large "
        "model's on the same questions, with a paired 95% bootstrap interval: excluding 0, the ensemble differs "
        "significantly (docs/quality.md).\n"
    ),
    "acceptance": (
        "τ: mean accepted length, tokens emitted per forward of the large model (the verifier's own token "
        "included; autoregressive decoding = 1.00); τ by model: the same per model of the set, in order. "
        "Acceptance: accepted over verified proposals; draft acceptance: accepted over proposed (vLLM's); "
        "per position: the acceptance rate of the 1st, 2nd, ... token of a verified block.\n"
    ),
    "exactness": (
        "T=0 cells: the share of samples whose tokens equal the baseline's (Spec-Bench's equality check); each "
        "mismatch attributed to numerics (a near-tie in a float64 recompute at the first divergent token) or a "
        "bug (unchecked: the float64 recompute could not run, see the cell's .speed.json). In float32/float64 "
        "on a CPU every sample is expected to match.\n"
    ),
    "predicted_vs_measured": (
        "Predicted: the method's forwards priced at each model's measured cost of one forward (a forward of k "
        "tokens assumed as cheap as one, the loop free); measured: side by side. Overhead: share of wall time "
        "outside model forwards. Union: for members with different tokenizers, the size of the union vocabulary "
        "and the seconds spent mapping the members' rows into it over the cell's samples (part of the overhead; "
        "blank for one shared vocabulary).\n"
    ),
    "spec_bench_categories": (
        "Spec-Bench's six categories: speed-up over the standard method [{conf} interval], and τ; Overall: "
        "the cell's figure over all its prompts pooled (Spec-Bench's Overall).\n"
    ),
    "drafts": (
        "The distilled models the grid uses (docs/proposers.md), each trained for a fixed number of steps from a "
        "seed (the same weights on any machine with the same library versions and threads): its loss (ce: the "
        "teacher's argmax; kl, tvd: its whole distribution), how often it agrees with its teacher's greedy token "
        "on held-out HumanEval continuations (T=0: greedy acceptance; a student: equal pieces), its expected "
        "acceptance at T=1 (the sum of min(p, q)), alone and with prompt lookup first, and the seconds taken.\n"
    ),
    "beside": (
        "Every process that took CPU time (20 ms or more) while a generation job timed a run, by what it is "
        "(`pipeline <command>`: a job of this workflow): in how many cells and timed samples, how many of those "
        "were interfered with (the run's own wait for a CPU or its preemptions over their thresholds) and its "
        "CPU seconds in them; the first row counts every timed sample (a pair where the cell has a baseline). "
        "Every job but generation runs at nice 19, so beside a timed run it takes a spare core or waits "
        '(docs/speed.md, "Interference").\n'
    ),
    "flags": (
        "Cells whose speed-up should not be trusted as it stands: interval wider than the bound, too many pairs "
        "interfered with after re-measuring, samples timed on different machines, or a measured speed-up far "
        "from the cost model's prediction. Run them again on a quiet machine (delete their generations).\n"
    ),
}


def caption(table: layout.Table, found: Collected) -> str:
    peers = PEERS if found.cells["kind"].eq("peer").any() else ""
    citation = (found.reported or {}).get("citation")
    return CAPTIONS[table.name].format(conf=f"{found.confidence:.0%}", peers=peers, citation=citation)


def aggregate(results: Path, reported: dict | None = None) -> list[Path]:
    """Write every table and plot for ``results`` and its ``results.json``; returns the paths written.
    ``reported``: the paper's figures (default: config/paper_reported.yaml), set beside ours when they name
    this experiment."""
    results = Path(results)
    found = collect(results, reported)
    cells, out, plots = found.cells, results / "tables", results / "plots"
    plots.mkdir(parents=True, exist_ok=True)  # an output of the workflow, also when no plot applies
    if cells.empty:
        raise ResultsError(f"no finished cells under {results}/generations")
    unstable = int(cells["unstable"].sum())
    sections = [
        f"# Results of experiment {cells['experiment'].iloc[0]}\n"
        if "experiment" in cells
        else f"# Results: {results}\n",
        f"{len(cells)} cells ({', '.join(sorted(cells['dataset'].unique()))}). Speed is total new tokens over total "
        f"wall time of the cell's samples; every speed-up has its {found.confidence:.0%} paired-bootstrap "
        f"interval over prompts [low, high]. {unstable} cell{'s are' if unstable != 1 else ' is'} marked "
        "(unstable): see Flags.\n",
    ]
    written: list[Path] = []
    for table in TABLES:
        files = layout.render(table, found) or {}
        for name, text in files.items():
            write_atomic(out / name, text)
            written.append(out / name)
        if f"{table.name}.md" in files:
            sections += [f"## {table.title}\n", caption(table, found), files[f"{table.name}.md"]]
    p = plot_speedup_vs_gamma(found, plots / "speedup_vs_gamma.png")
    q = plot_predicted(found, plots / "predicted_vs_measured.png")
    written += [x for x in (p, q) if x]
    sections += [f"![speed-up vs gamma](../plots/{p.name})\n" if p else ""]
    write_atomic(out / "summary.md", "\n".join(s for s in sections if s))
    ratios = per_cell(found, RATIOS)  # what results.json adds to each cell's own records
    ratios.attrs["confidence"] = found.confidence
    return [*written, out / "summary.md", write_results_file(results, ratios)]
