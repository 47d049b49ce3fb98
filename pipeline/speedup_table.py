"""A speed-up table's numbers (its CSV): rows model set x method (x T), per dataset the best cell's estimate, its
interval, gamma, τ, tokens/s and flags, then the Overall over the datasets, as Spec-Bench prints it."""

from __future__ import annotations

import numpy as np
import pandas as pd

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
OVERALL = "Overall"
OVERALL_NOTE = (
    "Overall: the mean over the row's datasets (Spec-Bench's Overall column), its interval from the datasets' "
    "taken as independent. The CSV adds per dataset γ, τ, tokens/s and flags.\n"
)


def overall(values, lows, highs) -> tuple[float, float | None, float | None]:
    """Spec-Bench's Overall: the mean of a row's speed-ups over its datasets (arrays aligned by dataset). Its
    interval treats the datasets' estimates as independent and each side of their intervals as a normal one's:
    the mean's half-width on each side is the root of the summed squared half-widths over the number of datasets."""
    v, lo, hi = (np.asarray(x, dtype=float) for x in (values, lows, highs))
    ok = ~np.isnan(v)
    v, lo, hi = v[ok], lo[ok], hi[ok]
    mean = float(v.mean())
    if np.isnan(lo).any() or np.isnan(hi).any():
        return mean, None, None
    n = len(v)
    return mean, mean - float(np.sqrt(((v - lo) ** 2).sum())) / n, mean + float(np.sqrt(((hi - v) ** 2).sum())) / n


def numbers(best: pd.DataFrame, value: str) -> pd.DataFrame:
    """``best``: one cell per row, indexed by model set x method x T x dataset (the last level), with the columns
    ``PER_DATASET`` names; ``value``: the speed-up's column. Columns per dataset (``PER_DATASET``'s suffixes),
    then ``Overall``, ``Overall_low``, ``Overall_high``, ``Overall_datasets`` (how many it averages) and
    ``Overall_unstable`` (any of them unstable)."""
    columns = {suffix: source.format(v=value) for suffix, source in PER_DATASET.items()}
    wide = best[list(dict.fromkeys(columns.values()))].unstack("dataset")
    datasets = sorted(best.index.get_level_values("dataset").unique())
    num = pd.DataFrame(
        {f"{ds}{suffix}": wide[(source, ds)] for ds in datasets for suffix, source in columns.items()},
        index=wide.index,
    )
    means = [
        overall(*(num.loc[i, [f"{ds}{s}" for ds in datasets]].to_numpy(float) for s in ("", "_low", "_high")))
        for i in num.index
    ]
    for j, suffix in enumerate(("", "_low", "_high")):
        num[OVERALL + suffix] = [m[j] for m in means]
    num[OVERALL + "_datasets"] = num[datasets].notna().sum(axis=1)
    num[OVERALL + "_unstable"] = num[[f"{ds}_unstable" for ds in datasets]].fillna(False).astype(bool).any(axis=1)
    return num
