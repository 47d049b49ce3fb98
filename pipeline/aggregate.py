"""Tables and plots from a results directory.

Reads ``grid.json`` (the cells of the current config) and each cell's files
under ``generations/``, and writes to ``tables/`` (CSV and Markdown) and
``plots/`` (PNG):

- ``cells.csv``: one row per cell, every measured number;
- ``speedup_vs_standard``: tokens/s over the cell's standard method (an
  ensemble for ``*_sd`` / ``*_se``, the large model for ``sd``), measured side
  by side in the same job when the cell ran its baseline beside it;
- ``speedup_vs_large``: tokens/s over the large model alone (its own cell);
- ``quality``: every task metric (pass@1, accuracy, ROUGE, ...);
- ``acceptance``: mean accepted tokens per verification round;
- ``predicted_vs_measured``: the speed-up predicted from the measured
  forwards and measured per-forward costs beside the measured one;
- ``summary.md``: all of them in one page;
- ``plots/speedup_vs_gamma.png`` and ``plots/predicted_vs_measured.png``.

The speed-up tables are shaped like the paper's: rows are model set x
method, columns datasets; the value is the best over the gamma sweep, with
that gamma in the Markdown.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd

from .files import atomic_path, read_jsonl, write_atomic

ROW = ["model_set", "method", "T"]


def predicted_speedup(rows: list[dict[str, Any]]) -> float | None:
    """Speed-up predicted from counted forwards and measured per-forward costs (side-by-side rows).

    Each model's cost of one forward is measured in the baseline run (where it
    decodes one token per forward), else in the method's own run. The
    prediction prices every forward of the method at that cost, i.e. assumes
    a forward of k new tokens costs what a forward of one does and the loop
    costs nothing; the gap to the measured speed-up is what those assumptions
    miss on this hardware.
    """
    if not rows or any("baseline" not in r for r in rows):
        return None
    n = max(len(r["stats"]["models"]) for r in rows)
    calls_m, time_m, calls_b, time_b = [0] * n, [0.0] * n, [0] * n, [0.0] * n
    tokens_m = sum(r["stats"]["new_tokens"] for r in rows)
    tokens_b = sum(r["baseline"]["stats"]["new_tokens"] for r in rows)
    for r in rows:
        for i, m in enumerate(r["stats"]["models"]):
            calls_m[i] += m["forward_calls"]
            time_m[i] += m["forward_time_s"]
        for i, m in enumerate(r["baseline"]["stats"]["models"][:n]):
            calls_b[i] += m["forward_calls"]
            time_b[i] += m["forward_time_s"]
    cost = []
    for i in range(n):
        if calls_b[i]:
            cost.append(time_b[i] / calls_b[i])
        elif calls_m[i]:
            cost.append(time_m[i] / calls_m[i])
        else:
            cost.append(0.0)
    per_token_m = sum(c * k for c, k in zip(cost, calls_m)) / tokens_m if tokens_m else 0
    per_token_b = sum(c * k for c, k in zip(cost, calls_b)) / tokens_b if tokens_b else 0
    return per_token_b / per_token_m if per_token_m and per_token_b else None


def same_as_baseline(rows: list[dict[str, Any]]) -> float | None:
    if not rows or any("baseline" not in r for r in rows):
        return None
    return sum(r["output"] == r["baseline"]["output"] for r in rows) / len(rows)


def collect(results: Path) -> pd.DataFrame:
    """One row per cell of ``grid.json`` whose files exist."""
    grid = json.loads((results / "grid.json").read_text())
    records = []
    for dims in grid:
        base = results / "generations" / f"{dims['id']}.jsonl"
        if not base.with_suffix(".speed.json").exists():
            continue
        speed = json.loads(base.with_suffix(".speed.json").read_text())
        rows = read_jsonl(base)
        rec = {k: v for k, v in dims.items() if k != "models"}
        rec["models"] = " + ".join(dims["models"])
        rec.update(
            samples=speed["samples"],
            new_tokens=speed["new_tokens"],
            tokens_per_s=speed["tokens_per_s"],
            baseline_tokens_per_s=speed.get("baseline_tokens_per_s"),
            speedup_side_by_side=speed.get("speedup_side_by_side"),
            mean_accepted_per_round=speed["mean_accepted_per_round"],
            acceptance_rate=speed["acceptance_rate"],
            predicted_speedup=predicted_speedup(rows),
            same_output_as_baseline=same_as_baseline(rows),
            overhead=speed["overhead"],
        )
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
    return _add_ratios(df)


def _add_ratios(df: pd.DataFrame) -> pd.DataFrame:
    """Speed-ups over the standard method (side by side when measured) and over the large model's own cell."""
    key = ["dataset", "temperature"]
    large = df[df["method"] == "large_model"].set_index([*key, "model_set"])["tokens_per_s"]
    plain = df[df["kind"] == "plain"].set_index([*key, "model_set", "method"])["tokens_per_s"]

    def vs_large(r):
        v = large.get((r["dataset"], r["temperature"], r["large_model"]))
        return r["tokens_per_s"] / v if v else None

    def vs_standard(r):
        if not isinstance(r["standard"], str):
            return None
        if r["kind"] == "plain":
            return 1.0  # an ensemble is its own standard
        if pd.notna(r.get("speedup_side_by_side")):
            return r["speedup_side_by_side"]
        if r["standard"] == "large_model":
            return vs_large(r)
        v = plain.get((r["dataset"], r["temperature"], r["model_set"], r["standard"]))
        return r["tokens_per_s"] / v if v else None

    df["speedup_vs_large"] = df.apply(vs_large, axis=1)
    df["speedup_vs_standard"] = df.apply(vs_standard, axis=1)
    return df


def _best(df: pd.DataFrame, value: str) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Rows: model set x method (x T); columns: datasets; the best value over gamma (numbers, and text with gamma)."""
    d = df.dropna(subset=[value])
    if d.empty:
        return pd.DataFrame(), pd.DataFrame()
    idx = d.groupby([*ROW, "dataset"])[value].idxmax()
    best = d.loc[idx]
    num = best.pivot_table(index=ROW, columns="dataset", values=value, aggfunc="first")

    def text(r):
        g = f" (γ={r['gamma']})" if r["gamma"] else ""
        return f"{r[value]:.2f}x{g}"

    txt = best.assign(_t=best.apply(text, axis=1)).pivot_table(
        index=ROW, columns="dataset", values="_t", aggfunc="first"
    )
    return num, txt


def _cell_table(df: pd.DataFrame, values: list[str]) -> pd.DataFrame:
    """Rows: model set x method x T x gamma; columns: dataset (x value)."""
    d = df[[*ROW, "gamma", "dataset", *values]].dropna(subset=values, how="all")
    if d.empty:
        return pd.DataFrame()
    t = d.pivot_table(index=[*ROW, "gamma"], columns="dataset", values=values, aggfunc="first")
    if len(values) == 1:
        t.columns = t.columns.droplevel(0)
    else:
        t.columns = [f"{ds} {v.removeprefix('q:')}" for v, ds in t.columns]
    return t


def _md(table: pd.DataFrame, floatfmt: str = ".2f") -> str:
    if table.empty:
        return "_no cells_\n"
    return table.reset_index().to_markdown(index=False, floatfmt=floatfmt) + "\n"


def _save(out: Path, name: str, num: pd.DataFrame, md: str) -> list[Path]:
    write_atomic(out / f"{name}.csv", num.to_csv())
    write_atomic(out / f"{name}.md", md)
    return [out / f"{name}.csv", out / f"{name}.md"]


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    return plt


def _savefig(fig, path: Path) -> Path:
    """Lay out, save atomically and close a figure."""
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=120)
    _pyplot().close(fig)
    return path


def plot_speedup_vs_gamma(df: pd.DataFrame, path: Path) -> Path | None:
    plt = _pyplot()
    d = df[df["kind"] != "plain"].dropna(subset=["speedup_vs_standard"])
    if d.empty:
        return None
    datasets = sorted(d["dataset"].unique())
    fig, axes = plt.subplots(1, len(datasets), figsize=(5.5 * len(datasets), 4), squeeze=False)
    for ax, ds in zip(axes[0], datasets):
        sub = d[d["dataset"] == ds].assign(g=lambda x: x["gamma"].map(lambda v: int(str(v).split("-")[-1])))
        for (ms, method, t), g in sub.groupby(ROW):
            g = g.sort_values("g")
            ax.plot(g["g"], g["speedup_vs_standard"], marker="o", label=f"{method} ({ms}, T={t})")
        ax.axhline(1.0, color="grey", lw=0.8, ls="--")
        ax.set_xticks(sorted(sub["g"].unique()))
        ax.set_title(ds)
        ax.set_xlabel("gamma (for *_se: the last model's; see the tables for the full list)")
        ax.set_ylabel("speed-up over the standard method")
        ax.legend(fontsize=7)
    return _savefig(fig, path)


def plot_predicted(df: pd.DataFrame, path: Path) -> Path | None:
    plt = _pyplot()
    d = df.dropna(subset=["predicted_speedup", "speedup_side_by_side"])
    if d.empty:
        return None
    fig, ax = plt.subplots(figsize=(5, 5))
    for method, g in d.groupby("method"):
        ax.scatter(g["predicted_speedup"], g["speedup_side_by_side"], label=method)
    hi = max(d["predicted_speedup"].max(), d["speedup_side_by_side"].max()) * 1.1
    ax.plot([0, hi], [0, hi], color="grey", lw=0.8, ls="--")
    ax.set_xlabel("predicted speed-up (counted forwards x measured cost)")
    ax.set_ylabel("measured speed-up (side by side)")
    ax.legend(fontsize=7)
    return _savefig(fig, path)


def aggregate(results: Path) -> list[Path]:
    """Write every table and plot for ``results``; returns the paths written."""
    results = Path(results)
    df = collect(results)
    out, plots = results / "tables", results / "plots"
    written: list[Path] = []
    if df.empty:
        raise ValueError(f"no finished cells under {results}/generations")
    write_atomic(out / "cells.csv", df.to_csv(index=False))
    written.append(out / "cells.csv")
    sections = [
        f"# Results of experiment {df['experiment'].iloc[0]}\n" if "experiment" in df else f"# Results: {results}\n",
        f"{len(df)} cells ({', '.join(sorted(df['dataset'].unique()))}). Speed is total new tokens over total "
        "wall time of the cell's samples.\n",
    ]

    tables = []  # (file name, title, caption, numbers, Markdown)
    num, txt = _best(df, "speedup_vs_standard")
    caption = (
        "Tokens/s over the cell's standard method (the ensemble for `*_sd`/`*_se`, the large model for `sd`), "
        "measured side by side in the same job; best over the gamma sweep.\n"
    )
    tables.append(("speedup_vs_standard", "Speed-up over the standard method", caption, num, _md(txt)))
    num, txt = _best(df, "speedup_vs_large")
    caption = "Tokens/s over the large model's own cell.\n"
    tables.append(("speedup_vs_large", "Speed-up over the large model alone", caption, num, _md(txt)))
    qcols = [c for c in df.columns if c.startswith("q:")]
    quality = _cell_table(df, qcols) if qcols else pd.DataFrame()
    tables.append(("quality", "Quality", "", quality, _md(quality, ".3f")))
    acc = _cell_table(df, ["mean_accepted_per_round"])
    caption = "Proposals accepted per verification round (the token the verifier adds is not counted).\n"
    tables.append(("acceptance", "Mean accepted tokens per round", caption, acc, _md(acc)))
    pvm = df.dropna(subset=["predicted_speedup"])[
        [*ROW, "gamma", "dataset", "acceptance_rate", "speedup_side_by_side", "predicted_speedup", "overhead"]
    ].set_index([*ROW, "gamma", "dataset"])
    caption = (
        "Predicted: the method's forwards priced at each model's measured cost of one forward (a forward of k "
        "tokens assumed as cheap as one, the loop free); measured: side by side. Overhead: share of wall time "
        "outside model forwards.\n"
    )
    tables.append(("predicted_vs_measured", "Predicted vs measured speed-up", caption, pvm, _md(pvm)))
    for name, title, caption, numbers, markdown in tables:
        written += _save(out, name, numbers, markdown)
        sections += [f"## {title}\n", caption, markdown]
    p = plot_speedup_vs_gamma(df, plots / "speedup_vs_gamma.png")
    q = plot_predicted(df, plots / "predicted_vs_measured.png")
    written += [x for x in (p, q) if x]
    sections += [f"![speed-up vs gamma](../plots/{p.name})\n" if p else ""]
    write_atomic(out / "summary.md", "\n".join(s for s in sections if s))
    written.append(out / "summary.md")
    return written
