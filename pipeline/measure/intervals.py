"""Intervals on quality figures, a mean over examples of a per-example score (docs/quality.md): Wilson's for
scores all 0 or 1, else a seeded percentile bootstrap over examples; 95% (``CONFIDENCE``).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

CONFIDENCE = 0.95  # of every quality interval
SEED = 0
RESAMPLES = 2000


def interval(values: Sequence[float], confidence: float = CONFIDENCE) -> tuple[float | None, float | None, str | None]:
    """``(low, high, method)`` for the mean of ``values`` (one per example); ``(None, None, None)`` when empty."""
    x = np.asarray(values, dtype=float)
    if x.size == 0:
        return None, None, None
    if np.isin(x, (0.0, 1.0)).all():
        from scipy.stats import binomtest

        ci = binomtest(int(x.sum()), int(x.size)).proportion_ci(confidence_level=confidence, method="wilson")
        return float(ci.low), float(ci.high), "wilson"
    return (*bootstrap_interval(x, confidence), "bootstrap")


def bootstrap_interval(values: Sequence[float], confidence: float = CONFIDENCE) -> tuple[float, float]:
    """A seeded percentile bootstrap of the mean over examples (also for paired differences, where a proportion's
    interval does not apply); a point when every value is alike."""
    x = np.asarray(values, dtype=float)
    if np.ptp(x) == 0:  # nothing to resample
        return float(x[0]), float(x[0])
    from scipy.stats import bootstrap

    res = bootstrap(
        (x,), np.mean, confidence_level=confidence, n_resamples=RESAMPLES, method="percentile", random_state=SEED
    )
    return float(res.confidence_interval.low), float(res.confidence_interval.high)


def per_example(ids: Sequence[str], values: Sequence[float | None]) -> list[float]:
    """The mean score of each example over its samples (in the order examples first appear); missing scores
    are left out."""
    by_id: dict[str, list[float]] = {}
    for i, v in zip(ids, values):
        if v is not None:
            by_id.setdefault(i, []).append(float(v))
    return [sum(v) / len(v) for v in by_id.values()]


def fmt_quality(value: float | None, low: float | None, high: float | None, digits: int = 2) -> str:
    """``0.31 [0.27, 0.36]``; ``-`` without a value."""
    if value is None or value != value:
        return "-"
    if low is None or high is None or low != low or high != high:
        return f"{value:.{digits}f}"
    return f"{value:.{digits}f} [{low:.{digits}f}, {high:.{digits}f}]"
