"""A declared table (``Table``; the list: ``aggregate.TABLES``) rendered from the collected figures (``render``):
its shape makes its numbers (the CSV) and its text (Markdown and HTML, each figure with its interval)."""

from __future__ import annotations

import fnmatch
from collections.abc import Callable
from dataclasses import dataclass
from html import escape

import pandas as pd

from ..measure.intervals import fmt_quality
from ..measure.speed import fmt
from .figures import CELL, ROW, Collected, parts, per_cell
from .results_file import paper_vs_ours

# a speed-up table's CSV columns per dataset: its suffix -> the cells.csv column it comes from ({v}: the value's name)
PER_DATASET = {
    "": "{v}",
    "_low": "{v}_low",
    "_high": "{v}_high",
    "_gamma": "gamma",
    "_tau": "tau",
    "_tokens_per_s": "tokens_per_s",
    "_unstable": "{v}_unstable",
    "_flags": "flags",
}
def speedup_numbers(best: pd.DataFrame, value: str) -> pd.DataFrame:
    """``best``: one cell per row, indexed by model set x method x T x dataset (the last level), with the columns
    ``PER_DATASET`` names; ``value``: the speed-up's column. Columns per dataset (``PER_DATASET``'s suffixes). No
    mean over datasets: Spec-Bench's Overall is its own column (every prompt of its categories pooled), and a mean
    of different benchmarks is no benchmark's figure."""
    columns = {suffix: source.format(v=value) for suffix, source in PER_DATASET.items()}
    wide = best[list(dict.fromkeys(columns.values()))].unstack("dataset")
    datasets = sorted(best.index.get_level_values("dataset").unique())
    return pd.DataFrame(
        {f"{ds}{suffix}": wide[(source, ds)] for ds in datasets for suffix, source in columns.items()},
        index=wide.index,
    )


Shaped = tuple[pd.DataFrame, pd.DataFrame] | None  # a table's numbers and text; None: it does not apply here


@dataclass(frozen=True)
class Table:
    name: str
    shape: Callable[[Collected, Table], Shaped]
    columns: tuple[str, ...] = ()  # the metrics or cell columns it shows (``by_dataset``: globs)
    title: str = ""
    keep: Callable[[pd.DataFrame], pd.Series] | None = None  # the cells whose rows it shows (default: all)
    index: tuple[str, ...] = tuple(CELL)
    files: tuple[str, ...] = ("csv", "md", "html")
    floatfmt: str = ".2f"


def markdown(table: Table, shown: pd.DataFrame) -> str:
    if shown.empty:
        return "_no cells_\n"
    return shown.reset_index().to_markdown(index=False, floatfmt=table.floatfmt) + "\n"


def html(table: Table, shown: pd.DataFrame, flag: str | None = None) -> str:
    """A table as a small HTML page (the report shows it); ``flag``: the line that flags the run, above it."""
    floats = f"{{:{table.floatfmt}}}".format
    body = "<p>no cells</p>" if shown.empty else shown.to_html(na_rep="-", float_format=floats)
    style = "table{border-collapse:collapse;font:13px sans-serif}td,th{border:1px solid #bbb;padding:2px 6px}"
    head = f"<!doctype html><html><head><meta charset='utf-8'><title>{table.title}</title><style>{style}</style>"
    banner = f"<p style='color:#a00'><b>{escape(flag.strip('*'))}</b></p>" if flag else ""
    return f"{head}</head><body>{banner}<h3>{table.title}</h3>{body}</body></html>\n"


def render(table: Table, found: Collected) -> dict[str, str] | None:
    """A declared table's files (name -> text): its numbers as CSV, its text as Markdown and HTML; None where it
    does not apply (no peer, no Spec-Bench category, the paper names another experiment)."""
    if (shaped := table.shape(found, table)) is None:
        return None
    numbers, shown = shaped
    flag = found.control.line  # the run's control missed: one line above every table a person reads
    text = {
        "csv": lambda: numbers.to_csv(index=bool(table.index)),
        "md": lambda: (f"{flag}\n\n" if flag else "") + markdown(table, shown),
        "html": lambda: html(table, shown, flag),
    }
    return {f"{table.name}.{kind}": text[kind]() for kind in table.files}


def every_figure(found: Collected, table: Table) -> Shaped:
    """``cells.csv``: per cell its dims, ``table.columns`` (the side-by-side interval as ``speedup_ci_low`` and
    ``_high``), per Spec-Bench category ``cat:<c>`` (its speed-up) and ``cat:<c>:tps``, ``:low``, ``:high``,
    ``:tau``, each task metric ``q:<name>`` then its interval, T, and the speed-ups across cells."""
    records = []
    for mine in parts(found).values():
        record = {}
        for (metric, c), f in mine.items():
            if metric == "tokens_per_s" and c:
                s, tau = mine.get(("speedup_side_by_side", c)), mine.get(("tau", c))
                record |= {f"cat:{c}": s and s.value, f"cat:{c}:tps": f.value, f"cat:{c}:low": s and s.low}
                record |= {f"cat:{c}:high": s and s.high, f"cat:{c}:tau": tau and tau.value}
        quality = [f for (metric, _), f in mine.items() if metric.startswith("q:")]
        record |= {f.metric: f.value for f in quality}
        record |= {f"{f.metric}{s}": v for f in quality for s, v in (("_low", f.low), ("_high", f.high)) if pd.notna(v)}
        records.append(record)
    ratios = ("speedup_vs_large", "speedup_vs_standard")  # in cells.csv's order, each with its interval
    wide = per_cell(found, [c for c in table.columns if c not in found.cells and "_ci_" not in c] + list(ratios))
    wide = wide.rename(columns=lambda c: c.replace("speedup_side_by_side_", "speedup_ci_"))  # cells.csv's names
    dims = [c for c in found.cells.columns if c not in ("unstable", "flags", "T")]
    extra = pd.DataFrame.from_records(records, index=found.cells.index)
    every = pd.concat(
        [wide[[*dims, *table.columns]], extra, wide[["T", *(c for c in wide.columns if c.startswith(ratios))]]], axis=1
    )
    return every, every


def best(found: Collected, table: Table) -> Shaped:
    """Rows: model set x method (x T); columns: datasets (``spec_bench``: Spec-Bench's Overall, its prompts
    pooled); the best value over gamma. Numbers: per dataset the estimate, its interval, gamma, τ, tokens/s and
    flags (``PER_DATASET``); text: the estimate with its interval and gamma."""
    (value,) = table.columns
    d = per_cell(found, [value, "tau", "tokens_per_s"]).dropna(subset=[value])
    if d.empty:
        return pd.DataFrame(), pd.DataFrame()
    best = d.loc[d.groupby([*ROW, "dataset"])[value].idxmax()]

    def text(r):
        g = f" (γ={r['gamma']})" if r["gamma"] else ""
        low, high = r.get(f"{value}_low"), r.get(f"{value}_high")
        return fmt(r[value], low, high) + g + (" (unstable)" if r[f"{value}_unstable"] else "")

    best = best.assign(_t=best.apply(text, axis=1))
    txt = best.pivot_table(index=ROW, columns="dataset", values="_t", aggfunc="first").fillna("-")  # not run: -
    return speedup_numbers(best.set_index([*ROW, "dataset"]), value), txt


def beside_paper(found: Collected, table: Table) -> Shaped:
    """The speed-ups the paper reports beside ours (``results_file.paper_vs_ours``), if it names the experiment."""
    versus = None if found.reported is None else paper_vs_ours(best(found, table)[0], found.reported)
    return None if versus is None else (versus, versus)


def by_cell(found: Collected, table: Table) -> Shaped:
    """Rows: the kept cells (``table.index``); columns: ``table.columns``, as numbers."""
    d = per_cell(found, [c for c in table.columns if c not in found.cells])
    shown = d[table.keep(d) if table.keep else slice(None)][[*table.index, *table.columns]]
    return (shown.set_index(list(table.index)),) * 2


def distilled(found: Collected, table: Table) -> Shaped:
    """Rows: the distilled models the grid uses; columns: ``table.columns`` of their training records (none:
    the table does not apply)."""
    if found.drafts.empty:
        return None
    d = found.drafts.set_index("model")[list(table.columns)].dropna(axis=1, how="all")
    whole = lambda v: int(v) if isinstance(v, float) and v.is_integer() else v  # noqa: E731 (counts stay counts)
    return d, d.astype(object).where(d.notna(), "-").map(whole)  # a student has no T=1 figure: "-"


EVERY_PAIR = "(every timed sample)"


def beside(found: Collected, table: Table) -> Shaped:
    """Rows: every timed sample, then each process that took CPU time beside a timed run, most often first;
    columns: cells and pairs it was seen in, how many of those pairs were interfered with, the share, its CPU
    seconds (none recorded: the table does not apply)."""
    d = found.beside
    if d is None or d.empty:
        return None
    g = d.assign(process=d["process"].replace("", EVERY_PAIR)).groupby("process", sort=False)
    g = g.agg(
        cells=("cell", "nunique"), pairs=("pairs", "sum"), interfered=("interfered", "sum"), cpu_s=("cpu_s", "sum")
    )
    g["interfered_share"] = (g["interfered"] / g["pairs"]).where(g["pairs"] > 0)
    order = [EVERY_PAIR, *g.drop(index=EVERY_PAIR).sort_values("pairs", ascending=False, kind="stable").index]
    g = g.loc[order, list(table.columns)]
    text = g.astype(object)
    text["interfered_share"] = [f"{v:.0%}" if pd.notna(v) else "-" for v in g["interfered_share"]]
    text["cpu_s"] = ["-" if p == EVERY_PAIR else f"{v:.1f}" for p, v in zip(g.index, g["cpu_s"])]
    return g, text


def with_intervals(numbers: pd.DataFrame) -> pd.DataFrame:
    """Each figure of a quality table (columns ``X``, ``X_low``, ``X_high``) as ``0.31 [0.27, 0.36]``."""
    text = pd.DataFrame(index=numbers.index)
    for c in [c for c in numbers.columns if not str(c).endswith(("_low", "_high"))]:
        low, high = (numbers.get(f"{c}{k}", pd.Series(None, index=numbers.index)) for k in ("_low", "_high"))
        text[c] = [fmt_quality(*(None if pd.isna(x) else x for x in v)) for v in zip(numbers[c], low, high)]
    return text


def by_dataset(found: Collected, table: Table) -> Shaped:
    """Rows: model set x method x T x gamma; columns: per dataset each metric matching ``table.columns`` (its
    ``q:`` left out) with its interval: numbers (``X``, ``X_low``, ``X_high``) and text."""
    metrics = [m for m in dict.fromkeys(found.figures["metric"]) if any(fnmatch.fnmatch(m, p) for p in table.columns)]
    d = per_cell(found, metrics) if metrics else found.cells
    values = [c for c in d.columns[len(found.cells.columns) :] if d[c].notna().any()]
    d = d[[*CELL, *values]].dropna(subset=values, how="all") if values else d.iloc[:0]
    if d.empty:
        return pd.DataFrame(), pd.DataFrame()
    t = d.pivot_table(index=[*ROW, "gamma"], columns="dataset", values=values, aggfunc="first")
    t.columns = t.columns.droplevel(0) if len(values) == 1 else [f"{ds} {v.removeprefix('q:')}" for v, ds in t.columns]
    return t, with_intervals(t)


def by_distribution(found: Collected, table: Table) -> Shaped:
    """One row per distribution the grid's cells draw from (``Collected.scored``), with the methods that share
    it: numbers and text, as ``by_dataset``."""
    if found.scored.empty:
        return pd.DataFrame(), pd.DataFrame()
    rows: dict[str, dict] = {}
    for r in found.scored.itertuples(index=False):
        row = rows.setdefault(r.distribution, {"methods": r.methods, "_first": r.first})
        row |= {r.metric: r.value, f"{r.metric}_low": r.low, f"{r.metric}_high": r.high}
    numbers = pd.DataFrame.from_dict(rows, orient="index").rename_axis("distribution").sort_values("_first")
    numbers.pop("_first")
    methods = numbers.pop("methods")
    text = with_intervals(numbers)
    numbers["methods"] = text["methods"] = methods
    return numbers, text


def over_peers(found: Collected, table: Table) -> Shaped:
    """Rows: each speculative cell of ours (model set, T, dataset, method and gamma); columns: each peer of the
    same model set, dataset and T (the category); the figure: ``table.columns`` with its interval."""
    f = found.figures[found.figures["metric"].isin(table.columns)]
    if f.empty:
        return None
    cells = found.cells.set_index("id").loc[f["cell"]].reset_index()
    ours = [f"{m} (γ={g})" for m, g in zip(cells["method"], cells["gamma"])]
    text = [fmt(v, lo, hi, unstable=bool(u)) for v, lo, hi, u in zip(f["value"], f["low"], f["high"], f["unstable"])]
    rows = cells.assign(ours=ours, peer=f["category"].to_numpy(), text=text)
    shown = rows.pivot_table(
        index=["model_set", "T", "dataset", "ours"], columns="peer", values="text", aggfunc="first"
    )
    return shown, shown


def across_engines(found: Collected, table: Table) -> Shaped:
    """Rows: ours (model set, T, dataset, our method and gamma); columns: vLLM's method it is set against (the
    category's two sides); the figure: ``table.columns``, tokens/s of ours over vLLM's, with its interval."""
    f = found.figures[found.figures["metric"].isin(table.columns)]
    if f.empty:
        return None
    cells = found.cells.set_index("id").loc[f["cell"]].reset_index()
    sides = [c.split(" / ", 1) for c in f["category"]]
    text = [fmt(v, lo, hi, unstable=bool(u)) for v, lo, hi, u in zip(f["value"], f["low"], f["high"], f["unstable"])]
    rows = cells.assign(ours=[a for a, _ in sides], vllm=[b for _, b in sides], text=text)
    shown = rows.pivot_table(
        index=["model_set", "T", "dataset", "ours"], columns="vllm", values="text", aggfunc="first"
    ).fillna("")  # each of ours is set against the vLLM methods that do its job
    return shown, shown


OVERALL = "Overall"  # Spec-Bench's: every prompt of the cell pooled (the by-category table's last column)


def categories(found: pd.Series) -> list[str]:
    """The categories present, in Spec-Bench's order (``tasks.spec_bench.CATEGORIES``), any other after them."""
    from tasks.spec_bench import CATEGORIES

    present = set(found)
    return [c for c in CATEGORIES if c in present] + sorted(present - set(CATEGORIES))


def by_category(found: Collected, table: Table) -> Shaped:
    """Rows: the cells with Spec-Bench categories; columns: each category, then Overall (every prompt of the cell
    pooled); the figure: ``table.columns``: a speed-up with its interval (tokens/s without a baseline), and τ."""
    figures = found.figures[found.figures["category"].ne("") & found.figures["metric"].isin(table.columns)]
    if figures.empty:
        return None
    every = parts(found)

    def text(cell, c) -> str:
        speedup, tps, tau = (every[cell].get((m, c)) for m in table.columns)
        if speedup is not None and pd.notna(speedup.value):
            figure = fmt(speedup.value, speedup.low, speedup.high)
        elif tps is not None and pd.notna(tps.value):
            figure = f"{tps.value:.1f} tok/s"
        else:
            return "-"
        return figure + (f", τ {tau.value:.2f}" if tau is not None and pd.notna(tau.value) else "")

    out = found.cells[found.cells["id"].isin(figures["cell"])][["id", *CELL]].copy()
    for c in [*categories(figures["category"]), ""]:
        out[c or OVERALL] = [text(cell, c) for cell in out["id"]]  # Overall: the whole cell's, Spec-Bench's
    return (out.drop(columns="id").set_index(CELL),) * 2
