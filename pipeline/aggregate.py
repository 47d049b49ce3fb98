"""Tables and plots from a results directory.

Reads ``grid.json`` (the cells of the current config) and each cell's files
under ``generations/``, and writes to ``tables/`` (CSV and Markdown) and
``plots/`` (PNG):

- ``cells.csv``: one row per cell, every measured number;
- ``speedup_vs_standard``: tokens/s over the cell's standard method (an
  ensemble for ``*_sd`` / ``*_se``, the large model for ``sd``), measured side
  by side in the same job when the cell ran its baseline beside it;
- ``speedup_vs_large``: tokens/s over the large model alone (its own cell,
  prompts paired by id);
- ``quality``: every task metric (pass@1, accuracy, ROUGE, ...) with its 95% interval;
- ``likelihood``: multiple-choice tasks scored by log-likelihood (``likelihood/<task>.json``), one row per
  distinct distribution (the methods that share it named), each figure with its 95% interval;
- ``acceptance``: τ (mean accepted length), acceptance rates, per-position
  acceptance;
- ``exactness``: at T=0, the share of samples equal to the baseline's token
  for token, and each mismatch's attribution (numerics or bug);
- ``predicted_vs_measured``: the speed-up predicted from the measured
  forwards and measured per-forward costs beside the measured one;
- ``spec_bench_categories``: speed-up and τ per Spec-Bench category;
- ``flags``: every unstable cell and why;
- ``summary.md``: all of them in one page;
- ``plots/speedup_vs_gamma.png`` and ``plots/predicted_vs_measured.png``.

Every speed-up carries its interval (95% by default) (``1.55x [1.47, 1.63]``, ``speed.py``)
and an unstable cell is marked ``(unstable)`` in every table and drawn hollow
in every plot. The speed-up tables are shaped like the paper's: rows are
model set x method, columns datasets; the value is the best over the gamma
sweep, with that gamma in the Markdown.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd

from .files import ResultsError, atomic_path, read_jsonl, write_atomic
from .intervals import bootstrap_interval, fmt_quality
from .results_file import load_reported, paper_vs_ours, write_results_file
from .speed import Policy, fmt, halfwidth, paired_speedup, relative_speedup
from .speedup_table import OVERALL, OVERALL_NOTE
from .speedup_table import numbers as speedup_numbers

ROW = ["model_set", "method", "T"]
CELL = [*ROW, "gamma", "dataset"]  # one cell of a table
COLUMNS = (  # a cell's row of cells.csv, in order, after its dimensions
    "samples new_tokens tokens_per_s baseline_tokens_per_s speedup_side_by_side speedup_ci_low speedup_ci_high tau "
    "tau_by_model acceptance_rate draft_acceptance_rate position_acceptance predicted_speedup exact_match "
    "mismatches_numerics mismatches_bug mismatches_unchecked pairs_interfered pairs_remeasured overhead union_size "
    "union_map_s unstable flags"
).split()


def _joined(values) -> str | None:
    if not values:
        return None
    return " ".join("-" if v is None else f"{v:.2f}" for v in values)


def collect(results: Path) -> pd.DataFrame:
    """One row per cell of ``grid.json`` whose files exist."""
    grid = json.loads((results / "grid.json").read_text())
    records, samples, policy = [], {}, Policy()
    for dims in grid:
        base = results / "generations" / f"{dims['id']}.jsonl"
        if not base.with_suffix(".speed.json").exists():
            continue
        speed = json.loads(base.with_suffix(".speed.json").read_text())
        policy = Policy.from_dict(speed.get("policy"))  # the cells' own: one config judged them all
        samples[dims["id"]] = read_jsonl(base)
        rec = {k: v for k, v in dims.items() if k != "models"}
        rec["models"] = " + ".join(dims["models"])
        exact = speed.get("exactness") or {}
        unset = 0 if exact else None
        derived = {
            "tau_by_model": _joined(speed.get("tau_by_model")),
            "position_acceptance": _joined(speed.get("position_acceptance")),
            "exact_match": exact.get("rate"),
            "mismatches_numerics": exact.get("numerics", unset),
            "mismatches_bug": exact.get("bugs", unset),
            "mismatches_unchecked": exact.get("unchecked", unset),
            "unstable": bool(speed.get("unstable")),
            "flags": "; ".join(speed.get("flags", [])),
        }
        rec.update({k: derived.get(k, speed.get(k)) for k in COLUMNS})
        for category, c in (speed.get("by_category") or {}).items():
            rec[f"cat:{category}"] = c.get("speedup_side_by_side")
            rec[f"cat:{category}:tps"] = c["tokens_per_s"]
            rec[f"cat:{category}:low"] = c.get("speedup_ci_low")
            rec[f"cat:{category}:high"] = c.get("speedup_ci_high")
            rec[f"cat:{category}:tau"] = c.get("tau")
        summary = base.with_suffix(".summary.json")
        if summary.exists():
            for k, v in json.loads(summary.read_text()).items():
                if k not in ("task", "samples") and isinstance(v, int | float):
                    rec[f"q:{k}"] = v
        records.append(rec)
    df = pd.DataFrame.from_records(records)
    if df.empty:
        return df
    df["gamma"] = df["gamma"].fillna("")
    df["T"] = df["temperature"].map(lambda t: f"{t:g}")
    df.attrs["confidence"] = policy.confidence
    return _add_ratios(df, samples, policy)


def _add_ratios(df: pd.DataFrame, samples: dict[str, list[dict[str, Any]]], policy: Policy) -> pd.DataFrame:
    """Speed-ups over the standard method (side by side when measured) and over the large model's own cell.

    Each comes with its interval (``<name>_low``, ``<name>_high``) and ``<name>_unstable``: a ratio across
    cells (prompts paired by id) is unstable when either cell is, or when its interval is too wide.
    """
    key = ["dataset", "temperature"]
    large = df[df["method"] == "large_model"].set_index([*key, "model_set"])["id"]
    plain = df[df["kind"] == "plain"].set_index([*key, "model_set", "method"])["id"]
    unstable = df.set_index("id")["unstable"]

    def across(r, ref):  # the cell's speed over another cell's on the prompts both ran (paired by id)
        if not isinstance(ref, str):
            return None
        other = {x["id"]: x["stats"] for x in samples[ref]}
        found = paired_speedup([(x["stats"], other[x["id"]]) for x in samples[r["id"]] if x["id"] in other], policy)
        if found is None:
            return None
        hw = halfwidth(*found[:3])
        return (*found[:3], bool(r["unstable"] or unstable[ref] or (hw is not None and hw > policy.max_halfwidth)))

    def vs_large(r):
        return across(r, large.get((r["dataset"], r["temperature"], r["large_model"])))

    def vs_standard(r):
        if not isinstance(r["standard"], str):
            return None
        if r["kind"] == "plain":
            return 1.0, None, None, bool(r["unstable"])  # an ensemble is its own standard
        if pd.notna(r.get("speedup_side_by_side")):
            return r["speedup_side_by_side"], r["speedup_ci_low"], r["speedup_ci_high"], bool(r["unstable"])
        if r["standard"] == "large_model":
            return vs_large(r)
        return across(r, plain.get((r["dataset"], r["temperature"], r["model_set"], r["standard"])))

    for name, fn in (("speedup_vs_large", vs_large), ("speedup_vs_standard", vs_standard)):
        values = df.apply(fn, axis=1)
        for j, suffix in enumerate(("", "_low", "_high")):
            df[name + suffix] = values.map(lambda v, j=j: v[j] if v is not None else None).astype(float)
        df[name + "_unstable"] = values.map(lambda v: bool(v[3]) if v is not None else False)
    return df


def _best(df: pd.DataFrame, value: str) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Rows: model set x method (x T); columns: datasets and their Overall (the mean over them); the best value
    over gamma. Numbers: per dataset the estimate, its interval, gamma, τ, tokens/s and flags
    (``PER_DATASET``), then the Overall's; text: the estimate with its interval and gamma."""
    d = df.dropna(subset=[value])
    if d.empty:
        return pd.DataFrame(), pd.DataFrame()
    best = d.loc[d.groupby([*ROW, "dataset"])[value].idxmax()]

    def text(r):
        g = f" (γ={r['gamma']})" if r["gamma"] else ""
        low, high = r.get(f"{value}_low"), r.get(f"{value}_high")
        return fmt(r[value], low, high) + g + (" (unstable)" if r[f"{value}_unstable"] else "")

    best = best.assign(_t=best.apply(text, axis=1))
    txt = best.pivot_table(index=ROW, columns="dataset", values="_t", aggfunc="first")
    num = speedup_numbers(best.set_index([*ROW, "dataset"]), value)
    columns = [OVERALL + s for s in ("", "_low", "_high", "_unstable")]
    txt[OVERALL] = [fmt(v, lo, hi, unstable=bool(u)) for v, lo, hi, u in num[columns].itertuples(index=False)]
    return num, txt


def _cell_table(df: pd.DataFrame, values: list[str]) -> pd.DataFrame:
    """Rows: model set x method x T x gamma; columns: dataset (x value)."""
    d = df[[*CELL, *values]].dropna(subset=values, how="all")
    if d.empty:
        return pd.DataFrame()
    t = d.pivot_table(index=[*ROW, "gamma"], columns="dataset", values=values, aggfunc="first")
    if len(values) == 1:
        t.columns = t.columns.droplevel(0)
    else:
        t.columns = [f"{ds} {v.removeprefix('q:')}" for v, ds in t.columns]
    return t


def _with_intervals(numbers: pd.DataFrame) -> pd.DataFrame:
    """Each figure of a quality table (columns ``X``, ``X_low``, ``X_high``) as ``0.31 [0.27, 0.36]``."""
    figures = [c for c in numbers.columns if not str(c).endswith(("_low", "_high"))]
    text = pd.DataFrame(index=numbers.index)
    for c in figures:
        low, high = (numbers.get(f"{c}{k}", pd.Series(None, index=numbers.index)) for k in ("_low", "_high"))
        text[c] = [fmt_quality(*(None if pd.isna(x) else x for x in v)) for v in zip(numbers[c], low, high)]
    return text


def _quality(df: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Every task metric per cell with its interval: numbers (``X``, ``X_low``, ``X_high``) and text."""
    qcols = [c for c in df.columns if c.startswith("q:")]
    numbers = _cell_table(df, qcols) if qcols else pd.DataFrame()
    return numbers, _with_intervals(numbers) if not numbers.empty else numbers


def _likelihood(df: pd.DataFrame, results: Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Quality by log-likelihood (``likelihood/<task>.json``), one row per distribution the grid's cells draw
    from, with the methods that share it: numbers and text, as ``_quality``."""
    order: dict[str, int] = {}  # each method of a set by its first cell, so the rows follow the grid
    for i, use in enumerate(f"{m} ({s})" for m, s in zip(df["method"], df["model_set"])):
        order.setdefault(use, i)
    used = set(order)
    rows: dict[str, dict[str, Any]] = {}
    for path in sorted((results / "likelihood").glob("*.json")):
        found = json.loads(path.read_text())
        for key, score in found["scores"].items():
            if not used.intersection(score.get("uses", [])):
                continue  # a distribution of another config's grid
            uses = sorted((u for u in score["uses"] if u in used), key=order.get)
            row = rows.setdefault(key, {"methods": "; ".join(uses), "_first": order[uses[0]]})
            for metric, f in score["metrics"].items():
                name = f"{found['task']} {metric} (n={found['questions']})"
                row.update({name: f["value"], f"{name}_low": f["low"], f"{name}_high": f["high"]})
            row.update(_paired_with_large(found, key))
    if not rows:
        return pd.DataFrame(), pd.DataFrame()
    numbers = pd.DataFrame.from_dict(rows, orient="index").rename_axis("distribution").sort_values("_first")
    numbers.pop("_first")
    methods = numbers.pop("methods")
    text = _with_intervals(numbers)
    numbers["methods"] = text["methods"] = methods
    return numbers, text


def _paired_with_large(found: dict[str, Any], key: str) -> dict[str, float | None]:
    """An ensemble's figures minus its large model's on the same questions (``<task> <metric> - large``), with
    a paired interval (a bootstrap over questions): whether the ensemble differs from its large model."""
    score = found["scores"][key]
    ref = found["scores"].get(score.get("models", [key])[0])
    if ref is None or ref is score:
        return {}
    out = {}
    for metric, values in score["per_question"].items():
        diff = [a - b for a, b in zip(values, ref["per_question"][metric])]
        low, high = bootstrap_interval(diff)
        name = f"{found['task']} {metric} - large"
        out.update({name: sum(diff) / len(diff), f"{name}_low": low, f"{name}_high": high})
    return out


def _by_cell(df: pd.DataFrame, columns: str) -> pd.DataFrame:
    """The given columns (names separated by spaces) of each cell, indexed by the cell."""
    return df[[*CELL, *columns.split()]].set_index(CELL)


def _md(table: pd.DataFrame, floatfmt: str = ".2f") -> str:
    if table.empty:
        return "_no cells_\n"
    return table.reset_index().to_markdown(index=False, floatfmt=floatfmt) + "\n"


def _html(table: pd.DataFrame, title: str, floatfmt: str = ".2f") -> str:
    """A table as a small HTML page (the report shows it)."""
    body = "<p>no cells</p>" if table.empty else table.to_html(na_rep="-", float_format=f"{{:{floatfmt}}}".format)
    style = "table{border-collapse:collapse;font:13px sans-serif}td,th{border:1px solid #bbb;padding:2px 6px}"
    return f"<!doctype html><html><head><meta charset='utf-8'><title>{title}</title><style>{style}</style></head>" + (
        f"<body><h3>{title}</h3>{body}</body></html>\n"
    )


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    return plt


def _savefig(fig, path: Path) -> Path:
    """Lay out (unless the figure has its own layout engine), save atomically and close a figure."""
    if fig.get_layout_engine() is None:
        fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=120)
    _pyplot().close(fig)
    return path


def _errorbar(ax, x, rows: pd.DataFrame, columns: str, label, marker: str = "o", **kw) -> None:
    """Points with their intervals (``columns``: the value's, the low end's and the high end's); unstable cells
    hollow."""
    y, low, high = (rows[c] for c in columns.split())
    yerr = [(y - low).fillna(0).clip(lower=0), (high - y).fillna(0).clip(lower=0)]
    line = ax.errorbar(x, y, yerr=yerr, marker=marker, capsize=3, label=label, **kw)
    hollow = rows["unstable"].astype(bool).to_numpy()
    if hollow.any():
        x = pd.Series(x).to_numpy()
        ax.scatter(
            x[hollow], y[hollow], s=70, marker=marker, facecolors="white", edgecolors=line[0].get_color(), zorder=3
        )


MARKERS = "o s ^ D v P X < > * h p d 8 H".split()
JITTER = 0.3  # the width (in gamma units) over which a panel's points at one gamma are spread


def series_styles(series: list[tuple[str, str, str]]) -> dict[tuple[str, str, str], tuple[Any, str]]:
    """A (colour, marker) pair for each series ``(model set, method, T)`` of a panel, no two alike: the colour
    follows the model set, the marker the method and T; when either runs out, every series its own colour."""
    import matplotlib as mpl

    sets = list(dict.fromkeys(s[0] for s in series))
    kinds = list(dict.fromkeys(s[1:] for s in series))
    if len(sets) <= 10 and len(kinds) <= len(MARKERS):
        colours = mpl.colormaps["tab10"].colors
        return {s: (colours[sets.index(s[0])], MARKERS[kinds.index(s[1:])]) for s in series}
    cmap = mpl.colormaps["turbo"]
    n = len(series)
    return {s: (cmap(0.05 + 0.9 * i / max(n - 1, 1)), MARKERS[i % len(MARKERS)]) for i, s in enumerate(series)}


def _panels(d: pd.DataFrame) -> tuple[list[str], list[str]]:
    """The facets: a row per dataset, a column per method family (``single``: ``sd`` and the large model's
    peers; ``we``, ``cd``, ...: an ensemble's accelerated methods)."""
    return sorted(d["dataset"].unique()), sorted(d["family"].fillna("single").unique())


def speedup_vs_gamma_figure(df: pd.DataFrame):
    """The speed-up over the standard method against gamma, one panel per dataset and method family, each
    series (model set, method, T) with its own colour and marker, its interval, unstable points hollow, points
    at one gamma spread apart; each panel's legend to its right, outside the data. None without such cells."""
    plt = _pyplot()
    fixed = df["gamma"].astype(str).str.fullmatch(r"[0-9-]+")  # speculative with a fixed gamma ("3", "1-3")
    d = df[fixed].dropna(subset=["speedup_vs_standard"])
    if d.empty:
        return None
    d = d.assign(
        family=d["family"].fillna("single") if "family" in d else "single",
        g=d["gamma"].map(lambda v: int(str(v).split("-")[-1])),
    )
    datasets, families = _panels(d)
    fig, axes = plt.subplots(
        len(datasets),
        len(families),
        figsize=(7.5 * len(families), 3.6 * len(datasets) + 0.8),
        squeeze=False,
        layout="constrained",
    )
    conf = f"{df.attrs.get('confidence', 0.95):.0%}"
    columns = "speedup_vs_standard speedup_vs_standard_low speedup_vs_standard_high"
    for i, ds in enumerate(datasets):
        for j, family in enumerate(families):
            ax = axes[i][j]
            sub = d[(d["dataset"] == ds) & (d["family"] == family)]
            ax.set_title(f"{ds}: {family}", fontsize=10)
            if sub.empty:
                ax.text(0.5, 0.5, "no cells", ha="center", va="center", transform=ax.transAxes, color="grey")
                ax.set_xticks([])
                ax.set_yticks([])
                continue
            groups = list(sub.groupby(ROW))
            styles = series_styles([key for key, _ in groups])
            step = JITTER / max(len(groups) - 1, 1) if len(groups) > 1 else 0.0
            for k, ((ms, method, t), g) in enumerate(groups):
                g = g.sort_values("g")
                colour, marker = styles[(ms, method, t)]
                x = g["g"] + (k - (len(groups) - 1) / 2) * step
                line = "--" if t == "0" else "-"
                _errorbar(ax, x, g, columns, f"{method} ({ms}, T={t})", marker, color=colour, linestyle=line, ms=5)
            ax.axhline(1.0, color="grey", lw=0.8, ls="--")
            ax.set_xticks(sorted(sub["g"].unique()))
            ax.set_xlim(sub["g"].min() - 0.6, sub["g"].max() + 0.6)
            ax.set_xlabel("gamma (*_se: the last model's)", fontsize=8)
            ax.set_ylabel(f"speed-up over standard ({conf})", fontsize=8)
            ax.legend(
                fontsize=6.5,
                title="hollow: unstable",
                title_fontsize=6.5,
                loc="upper left",
                bbox_to_anchor=(1.01, 1.0),
                borderaxespad=0.0,
                ncols=2 if len(groups) > 14 else 1,
            )
    return fig


def plot_speedup_vs_gamma(df: pd.DataFrame, path: Path) -> Path | None:
    fig = speedup_vs_gamma_figure(df)
    return _savefig(fig, path) if fig is not None else None


def plot_predicted(df: pd.DataFrame, path: Path) -> Path | None:
    plt = _pyplot()
    d = df.dropna(subset=["predicted_speedup", "speedup_side_by_side"])
    if d.empty:
        return None
    fig, ax = plt.subplots(figsize=(5, 5))
    for method, g in d.groupby("method"):
        columns = "speedup_side_by_side speedup_ci_low speedup_ci_high"
        _errorbar(ax, g["predicted_speedup"], g, columns, method, linestyle="none")
    hi = max(d["predicted_speedup"].max(), d["speedup_ci_high"].fillna(0).max(), d["speedup_side_by_side"].max())
    ax.plot([0, hi * 1.1], [0, hi * 1.1], color="grey", lw=0.8, ls="--")
    ax.set_xlabel("predicted speed-up (counted forwards x measured cost)")
    ax.set_ylabel(f"measured speed-up, side by side ({df.attrs.get('confidence', 0.95):.0%} interval)")
    ax.legend(fontsize=7, title="hollow: unstable", title_fontsize=7)
    return _savefig(fig, path)


def _peers(df: pd.DataFrame, results: Path) -> pd.DataFrame:
    """Ours over transformers' own methods (``hf_*``): each speculative cell of ours against each peer cell of
    the same model set, dataset and T, as the ratio of their side-by-side speed-ups (``relative_speedup``)."""
    peers, ours = df[df["kind"] == "peer"], df[df["kind"].isin(["sd", "se"])]
    out, key, generations = [], ["model_set", "dataset", "temperature"], results / "generations"

    def label(r) -> str:
        return f"{r['method']} (γ={r['gamma']})"

    for _, p in peers.iterrows():
        theirs = read_jsonl(generations / f"{p['id']}.jsonl")
        policy = Policy.from_dict(json.loads((generations / f"{p['id']}.speed.json").read_text())["policy"])
        for _, o in ours[(ours[key] == p[key]).all(axis=1)].iterrows():
            ratio = relative_speedup(read_jsonl(generations / f"{o['id']}.jsonl"), theirs, policy)
            if ratio is not None:
                text = fmt(*ratio, unstable=bool(o["unstable"] or p["unstable"]))
                out.append((o["model_set"], o["T"], o["dataset"], label(o), label(p), text))
    if not out:
        return pd.DataFrame()
    table = pd.DataFrame(out, columns=["model_set", "T", "dataset", "ours", "peer", "ours_over_peer"])
    return table.pivot_table(
        index=["model_set", "T", "dataset", "ours"], columns="peer", values="ours_over_peer", aggfunc="first"
    )


def _categories(df: pd.DataFrame) -> pd.DataFrame:
    """Spec-Bench per category: speed-up with its interval (tokens/s where there is no baseline), and τ."""
    cats = sorted({c.split(":")[1] for c in df.columns if c.startswith("cat:")})
    if not cats:
        return pd.DataFrame()
    d = df.dropna(subset=[f"cat:{c}:tps" for c in cats], how="all")
    out = d[CELL].copy()

    def text(speedup, low, high, tps, tau) -> str:
        if pd.notna(speedup):
            figure = fmt(speedup, low, high)
        elif pd.notna(tps):
            figure = f"{tps:.1f} tok/s"
        else:
            return "-"
        return figure + (f", τ {tau:.2f}" if pd.notna(tau) else "")

    for c in cats:
        columns = [d[f"cat:{c}{k}"] for k in ("", ":low", ":high", ":tps", ":tau")]
        out[c] = [text(*values) for values in zip(*columns)]
    columns = ["speedup_side_by_side", "speedup_ci_low", "speedup_ci_high", "tokens_per_s", "tau"]
    out[OVERALL] = [text(*values) for values in zip(*(d[k] for k in columns))]  # Spec-Bench's: every prompt pooled
    return out.set_index(CELL)


def aggregate(results: Path, reported: dict | None = None) -> list[Path]:
    """Write every table and plot for ``results`` and its ``results.json``; returns the paths written.
    ``reported``: the paper's figures (default: config/paper_reported.yaml), set beside ours when they name
    this experiment."""
    results = Path(results)
    df = collect(results)
    out, plots = results / "tables", results / "plots"
    plots.mkdir(parents=True, exist_ok=True)  # an output of the workflow, also when no plot applies
    written: list[Path] = []
    if df.empty:
        raise ResultsError(f"no finished cells under {results}/generations")
    write_atomic(out / "cells.csv", df.to_csv(index=False))
    written.append(out / "cells.csv")
    unstable = int(df["unstable"].sum())
    conf = f"{df.attrs.get('confidence', 0.95):.0%}"
    sections = [
        f"# Results of experiment {df['experiment'].iloc[0]}\n" if "experiment" in df else f"# Results: {results}\n",
        f"{len(df)} cells ({', '.join(sorted(df['dataset'].unique()))}). Speed is total new tokens over total "
        f"wall time of the cell's samples; every speed-up has its {conf} paired-bootstrap interval over prompts "
        f"[low, high]. {unstable} cell{'s are' if unstable != 1 else ' is'} marked (unstable): see Flags.\n",
    ]

    tables = []  # (file name, title, caption, numbers, the table shown in Markdown and HTML[, its float format])
    num, txt = _best(df, "speedup_vs_standard")
    caption = (
        "Tokens/s over the cell's standard method (the ensemble for `*_sd`/`*_se`, the large model for `sd`), "
        f"measured side by side in the same job; best over the gamma sweep (the best of several noisy estimates "
        f"leans high: read the interval); {conf} interval in brackets. " + OVERALL_NOTE
    )
    if df["kind"].eq("peer").any():
        caption += (
            "`hf_*`: transformers' own `generate` (assisted generation, prompt lookup, `assistant_ensemble_weight`) "
            "with the model set's draft and the same gamma; transformers cannot take a restricted head, so they "
            "run on a set with a full-head draft, and the table's other rows of that set use the same draft.\n"
        )
    tables.append(("speedup_vs_standard", "Speed-up over the standard method", caption, num, txt))
    reported = load_reported() if reported is None else reported
    versus = paper_vs_ours(num, reported) if reported.get("experiment") in set(df.get("experiment", [])) else None
    if versus is not None:
        caption = (
            f"The speed-ups {reported['citation']} reports (config/paper_reported.yaml, with where each is stated) "
            f"beside ours over the standard method [{conf} interval]; a figure not transcribed stays empty.\n"
        )
        tables.append(("paper_vs_ours", "The paper beside ours", caption, versus, versus))
    versus = _peers(df, results)
    if not versus.empty:
        caption = (
            "Ours over transformers' own methods: each cell's side-by-side speed-up over its standard method "
            f"divided by the peer's, prompts paired ({conf} paired-bootstrap interval); `hf_assisted_ensemble` "
            "is not the weighted ensemble's distribution (docs/exactness.md).\n"
        )
        tables.append(("ours_vs_peers", "Ours over transformers' methods", caption, versus, versus))
    num, txt = _best(df, "speedup_vs_large")
    caption = "Tokens/s over the large model's own cell (another job; prompts paired by id). " + OVERALL_NOTE
    tables.append(("speedup_vs_large", "Speed-up over the large model alone", caption, num, txt))
    num, txt = _quality(df)
    caption = (
        "Every task metric of each cell's outputs, under its own name (pass@1, acc, ...), with its 95% interval "
        "over examples [low, high]: Wilson's for a proportion, else a bootstrap (docs/quality.md). Intervals "
        "that overlap read as no significant difference.\n"
    )
    tables.append(("quality", "Quality", caption, num, txt))
    num, txt = _likelihood(df, results)
    caption = (
        "Multiple-choice tasks scored by log-likelihood through lm-eval, once per distinct distribution rather "
        "than per cell: a lossless accelerated method (`sd`, `*_sd`, `*_se`, `*_me`, the peers) draws from its "
        "standard method's distribution and shares its figures (methods: the cells it stands for); scored at "
        "temperature 1 whatever the cells' T. acc: the answer with the highest log-likelihood; acc_norm: per "
        "character; n questions; 95% Wilson interval [low, high]. `- large`: an ensemble's figure minus its large "
        "model's on the same questions, with a paired 95% bootstrap interval: excluding 0, the ensemble differs "
        "significantly (docs/quality.md).\n"
    )
    tables.append(("likelihood", "Quality by log-likelihood, per distribution", caption, num, txt))
    columns = "tau tau_by_model acceptance_rate draft_acceptance_rate position_acceptance"
    acc = _by_cell(df[df["kind"] != "plain"], columns)
    caption = (
        "τ: mean accepted length, tokens emitted per forward of the large model (the verifier's own token "
        "included; autoregressive decoding = 1.00); τ by model: the same per model of the set, in order. "
        "Acceptance: accepted over verified proposals; draft acceptance: accepted over proposed (vLLM's); "
        "per position: the acceptance rate of the 1st, 2nd, ... token of a verified block.\n"
    )
    tables.append(("acceptance", "Mean accepted length and acceptance", caption, acc, acc))
    columns = "samples exact_match mismatches_numerics mismatches_bug mismatches_unchecked"
    exact = _by_cell(df.dropna(subset=["exact_match"]), columns)
    caption = (
        "T=0 cells: the share of samples whose tokens equal the baseline's (Spec-Bench's equality check); each "
        "mismatch attributed to numerics (a near-tie in a float64 recompute at the first divergent token) or a "
        "bug (unchecked: the float64 recompute could not run, see the cell's .speed.json). In float32/float64 "
        "on a CPU every sample is expected to match.\n"
    )
    tables.append(("exactness", "Exactness at T=0", caption, exact, exact))
    columns = "acceptance_rate speedup_side_by_side predicted_speedup overhead union_size union_map_s"
    pvm = _by_cell(df.dropna(subset=["predicted_speedup"]), columns)
    caption = (
        "Predicted: the method's forwards priced at each model's measured cost of one forward (a forward of k "
        "tokens assumed as cheap as one, the loop free); measured: side by side. Overhead: share of wall time "
        "outside model forwards. Union: for members with different tokenizers, the size of the union vocabulary "
        "and the seconds spent mapping the members' rows into it over the cell's samples (part of the overhead; "
        "blank for one shared vocabulary).\n"
    )
    tables.append(("predicted_vs_measured", "Predicted vs measured speed-up", caption, pvm, pvm))
    cats = _categories(df)
    if not cats.empty:
        caption = (
            f"Spec-Bench's six categories: speed-up over the standard method [{conf} interval], and τ; Overall: "
            "the cell's figure over all its prompts pooled (Spec-Bench's Overall).\n"
        )
        tables.append(("spec_bench_categories", "Spec-Bench by category", caption, cats, cats))
    flagged = df[df["unstable"]][["id", "samples", "pairs_interfered", "pairs_remeasured", "flags"]].set_index("id")
    caption = (
        "Cells whose speed-up should not be trusted as it stands: interval wider than the bound, too many pairs "
        "interfered with after re-measuring, samples timed on different machines, or a measured speed-up far "
        "from the cost model's prediction. Run them again on a quiet machine (delete their generations).\n"
    )
    tables.append(("flags", "Flags", caption, flagged, flagged))
    for name, title, caption, numbers, shown, *floatfmt in tables:
        markdown = _md(shown, *floatfmt)
        write_atomic(out / f"{name}.csv", numbers.to_csv())
        write_atomic(out / f"{name}.md", markdown)
        write_atomic(out / f"{name}.html", _html(shown, title, *floatfmt))
        written += [out / f"{name}.csv", out / f"{name}.md", out / f"{name}.html"]
        sections += [f"## {title}\n", caption, markdown]
    p = plot_speedup_vs_gamma(df, plots / "speedup_vs_gamma.png")
    q = plot_predicted(df, plots / "predicted_vs_measured.png")
    written += [x for x in (p, q) if x]
    sections += [f"![speed-up vs gamma](../plots/{p.name})\n" if p else ""]
    write_atomic(out / "summary.md", "\n".join(s for s in sections if s))
    written.append(out / "summary.md")
    written.append(write_results_file(results, df))
    return written
