"""The plots of an experiment (``plots/*.png``) from its collected figures (``pipeline.report.figures``): the speed-up
over the standard method against gamma, and the predicted speed-up against the measured one. Every point carries
its interval; an unstable cell's is drawn hollow."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from ..files import atomic_path
from .figures import ROW, Collected, per_cell


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


def _errorbar(ax, x, rows: pd.DataFrame, value: str, label, marker: str = "o", **kw) -> None:
    """Points of the column ``value`` with their intervals (``<value>_low``, ``_high``); unstable cells hollow."""
    y, low, high = (rows[value + suffix] for suffix in ("", "_low", "_high"))
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


def speedup_vs_gamma_figure(found: Collected):
    """The speed-up over the standard method against gamma, one panel per dataset and method family, each
    series (model set, method, T) with its own colour and marker, its interval, unstable points hollow, points
    at one gamma spread apart; each panel's legend to its right, outside the data. None without such cells."""
    plt = _pyplot()
    value = "speedup_vs_standard"
    df = per_cell(found, [value])
    fixed = df["gamma"].astype(str).str.fullmatch(r"[0-9-]+")  # speculative with a fixed gamma ("3", "1-3")
    d = df[fixed].dropna(subset=[value])
    if d.empty:
        return None
    d = d.assign(
        family=d["family"].fillna("single") if "family" in d else "single",
        g=d["gamma"].map(lambda v: int(str(v).split("-")[-1])),
    )
    # a row of panels per dataset, a column per method family (single: sd and the peers; we, cd, ...)
    datasets, families = sorted(d["dataset"].unique()), sorted(d["family"].unique())
    n, m = len(datasets), len(families)
    fig, axes = plt.subplots(n, m, figsize=(7.5 * m, 3.6 * n + 0.8), squeeze=False, layout="constrained")
    conf = f"{found.confidence:.0%}"
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
                _errorbar(ax, x, g, value, f"{method} ({ms}, T={t})", marker, color=colour, linestyle=line, ms=5)
            ax.axhline(1.0, color="grey", lw=0.8, ls="--")
            ax.set_xticks(sorted(sub["g"].unique()))
            ax.set_xlim(sub["g"].min() - 0.6, sub["g"].max() + 0.6)
            ax.set_xlabel("gamma (*_se: the last model's)", fontsize=8)
            ax.set_ylabel(f"speed-up over standard ({conf})", fontsize=8)
            legend = dict(fontsize=6.5, title="hollow: unstable", title_fontsize=6.5, loc="upper left")
            ax.legend(**legend, bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0, ncols=2 if len(groups) > 14 else 1)
    return fig


def plot_speedup_vs_gamma(found: Collected, path: Path) -> Path | None:
    fig = speedup_vs_gamma_figure(found)
    return _savefig(fig, path) if fig is not None else None


def plot_predicted(found: Collected, path: Path) -> Path | None:
    plt = _pyplot()
    shown = ["predicted_speedup", "speedup_side_by_side"]
    d = per_cell(found, shown).dropna(subset=shown)
    if d.empty:
        return None
    fig, ax = plt.subplots(figsize=(5, 5))
    for method, g in d.groupby("method"):
        _errorbar(ax, g["predicted_speedup"], g, "speedup_side_by_side", method, linestyle="none")
    hi = max(d[shown].max().max(), d["speedup_side_by_side_high"].fillna(0).max())
    ax.plot([0, hi * 1.1], [0, hi * 1.1], color="grey", lw=0.8, ls="--")
    ax.set_xlabel("predicted speed-up (counted forwards x measured cost)")
    ax.set_ylabel(f"measured speed-up, side by side ({found.confidence:.0%} interval)")
    ax.legend(fontsize=7, title="hollow: unstable", title_fontsize=7)
    return _savefig(fig, path)
