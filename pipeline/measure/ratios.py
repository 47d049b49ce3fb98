"""Ratios of totals over prompts and their intervals (docs/speed.md, "The interval" and "Coverage").

A speed-up is a ratio of totals: the method's total new tokens over its total wall time, over the baseline's
(Spec-Bench's definition), ``(ΣTm/ΣWm) / (ΣTb/ΣWb)``; ours over a peer is the ratio of two such speed-ups. Both are
products of per-series totals raised to ±1, so their logarithm is a signed sum of log-totals (``SPEEDUP``,
``SPEEDUP_OVER_SPEEDUP``: the sign of each series), and one standard error serves both: the jackknife's, each prompt
left out of the totals in turn (for a ratio of totals a little wider than the delta method's, and what covered
better on synthetic prompts at n = 10: 93% against 92%).

The interval methods (``METHODS``; the config's ``timing.interval``; the first is the default):

- ``t``: the log-ratio ± Student's t quantile with n-1 degrees of freedom times the standard error, then
  exponentiated; the standard error is the jackknife's and the run's own noise (``run_noise``) in quadrature: a
  run's estimate also moves by what no prompt of it shows (the job's process, the machine's state through the
  run), which the A/A study measured at 0.3% (docs/speed.md, "Coverage") and without which the intervals of the
  runs whose prompts happened to agree were too narrow. With 10 prompts a cell the t quantile is 2.26 where a
  normal's is 1.96, and the variance divides by n-1: together 22% wider than a bootstrap's spread at n = 10.
- ``studentized``: the bootstrap-t: resampled prompts studentized by their own jackknife standard error.
- ``bca`` and ``percentile``: scipy's paired bootstrap (BCa corrects bias and skew; both run short with few prompts).

Each returns ``(low, high, method)``: ``(None, None, None)`` with fewer than two prompts, and the estimate itself
(``degenerate``) when every prompt's influence is alike (nothing varies: no width to give).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence

import numpy as np

METHODS = ("t", "studentized", "bca", "percentile")
SPEEDUP = (1, -1, -1, 1)  # tokens_m, wall_m, tokens_b, wall_b: (ΣTm/ΣWm) / (ΣTb/ΣWb)
SPEEDUP_OVER_SPEEDUP = (*SPEEDUP, *(-s for s in SPEEDUP))  # a's four series, then b's: a's speed-up over b's


def _data(series: Sequence[Sequence[float]]) -> np.ndarray:
    return np.asarray([np.asarray(x, dtype=float) for x in series])


def ratio_of_totals(*series: Sequence[float], signs: Sequence[int] = SPEEDUP) -> float:
    """The ratio of totals itself, ``Π_k (Σ_i x_ki)^s_k``, as products and a quotient (a series over itself is
    exactly 1.0, which the exponential of its log-ratio need not be)."""
    totals = _data(series).sum(axis=1)
    up = math.prod(float(t) for t, s in zip(totals, signs) if s > 0)
    return up / math.prod(float(t) for t, s in zip(totals, signs) if s < 0)


def log_ratio(*series: Sequence[float], signs: Sequence[int] = SPEEDUP) -> float:
    """The log of the ratio of totals: ``Σ_k s_k log Σ_i x_ki``."""
    return float(np.dot(signs, np.log(_data(series).sum(axis=1))))


def _log_ratios(data: np.ndarray, signs: np.ndarray) -> np.ndarray:
    """Vectorized over any leading axes of ``data[k, ..., i]``: the log-ratio of each resample."""
    return np.tensordot(signs, np.log(data.sum(axis=-1)), axes=1)


def _jackknife_se(data: np.ndarray, signs: np.ndarray) -> np.ndarray:
    """The jackknife standard error of the log-ratio over prompts, vectorized over any leading axes of
    ``data[k, ..., i]`` (-> ``[...]``): each prompt left out in turn, from the totals without it."""
    n = data.shape[-1]
    left_out = np.tensordot(signs, np.log(data.sum(axis=-1, keepdims=True) - data), axes=1)  # [..., i]
    spread = ((left_out - left_out.mean(axis=-1, keepdims=True)) ** 2).sum(axis=-1)
    return np.sqrt((n - 1) / n * spread)


def standard_error(*series: Sequence[float], signs: Sequence[int] = SPEEDUP) -> float:
    """The jackknife standard error of the log-ratio over prompts."""
    return float(_jackknife_se(_data(series), np.asarray(signs, dtype=float)))


def ratio_interval(
    *series: Sequence[float],
    signs: Sequence[int] = SPEEDUP,
    method: str = METHODS[0],
    confidence: float = 0.95,
    resamples: int = 10_000,
    seed: int = 0,
    run_noise: float = 0.0,
) -> tuple[float | None, float | None, str | None]:
    """An interval for the ratio of totals of paired per-prompt series (``signs``: each series' exponent), by
    ``method`` (``METHODS``); ``run_noise``: the standard deviation of a run's log-ratio that its prompts cannot
    show (``t`` adds it to the jackknife's in quadrature). Returns ``(low, high, method used)``."""
    data, s = _data(series), np.asarray(signs, dtype=float)
    n = data.shape[1]
    if n < 2:
        return None, None, None
    estimate = float(_log_ratios(data, s))
    se = float(_jackknife_se(data, s))
    alpha = (1 - confidence) / 2
    if method == "t" and run_noise > 0 and math.isfinite(se):
        from scipy.stats import t

        half = float(t.ppf(1 - alpha, n - 1)) * math.sqrt(se**2 + run_noise**2)
        return math.exp(estimate - half), math.exp(estimate + half), "t"
    if not (se > 1e-12 and math.isfinite(se)):  # nothing varies but rounding: no width to give
        return math.exp(estimate), math.exp(estimate), "degenerate"
    if method == "t":
        from scipy.stats import t

        q = float(t.ppf(1 - alpha, n - 1))
        return math.exp(estimate - q * se), math.exp(estimate + q * se), "t"
    rng = np.random.default_rng(seed)
    if method == "studentized":
        idx = rng.integers(0, n, size=(resamples, n))
        resampled = data[:, idx]  # [k, b, i]
        se_b = _jackknife_se(resampled, s)
        ok = se_b > 1e-12
        t_b = (_log_ratios(resampled, s)[ok] - estimate) / se_b[ok]
        lo_q, hi_q = np.quantile(t_b, [alpha, 1 - alpha])
        return math.exp(estimate - hi_q * se), math.exp(estimate - lo_q * se), "studentized"
    if method not in ("bca", "percentile"):
        raise ValueError(f"interval method {method!r}: accepted: {', '.join(METHODS)}")
    from scipy.stats import bootstrap

    def statistic(*xs, axis=-1):
        return np.exp(np.tensordot(s, np.log(np.sum(np.asarray(xs), axis=axis)), axes=1))

    for kind in ("BCa", "percentile") if method == "bca" else ("percentile",):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # BCa's degenerate-distribution warning: the fallback handles it
            res = bootstrap(
                list(data),
                statistic,
                paired=True,
                vectorized=True,
                confidence_level=confidence,
                n_resamples=resamples,
                method=kind,
                rng=rng,
            )
        low, high = float(res.confidence_interval.low), float(res.confidence_interval.high)
        if math.isfinite(low) and math.isfinite(high):
            return low, high, kind
    return math.exp(estimate), math.exp(estimate), "degenerate"
