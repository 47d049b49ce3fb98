"""A cost model for token trees: which node budget pays off at the measured forward costs.

A forward of ``k`` new tokens costs ``a + b k`` (a line through forwards of
``k`` tokens timed over a context, ``forward_timing.forward_costs``). A round
of a tree with ``N`` nodes costs one target forward of ``N + 1`` tokens (the
root and the nodes) plus the drafter's forwards (one per depth) and emits
``τ`` tokens; the target alone emits one token per forward of one token. So

    speed-up = τ (a_t + b_t) / (a_t + b_t (N + 1) + D (a_d + b_d w))

with ``D`` drafter forwards per round of ``w`` tokens each. A chain of ``γ``
is the same with ``N = γ``, ``D = γ``, ``w = 1``. Where ``b_t`` is small
against ``a_t`` (a GPU at batch size 1), extra nodes are nearly free and the
best budget is large; on a CPU each node costs ``b_t / a_t`` of a forward and
the best budget is small.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def fit(costs: dict[int, float]) -> tuple[float, float]:
    """``(a, b)``: the least-squares line ``a + b k`` through measured costs of forwards of ``k`` tokens
    (``forward_timing.forward_costs``; at least two sizes), ``b`` at least 0."""
    n = len(costs)
    mk, mt = sum(costs) / n, sum(costs.values()) / n
    var = sum((k - mk) ** 2 for k in costs)
    b = max(0.0, sum((k - mk) * (t - mt) for k, t in costs.items()) / var) if var else 0.0
    return max(mt - b * mk, 0.0), b


def round_speedup(tau: float, nodes: float, depth: float, width: float, target: tuple, draft: tuple) -> float:
    """The speed-up over the target alone of rounds of ``nodes`` verified tokens, ``depth`` drafter forwards of
    ``width`` tokens each, emitting ``tau`` tokens per round (``target``, ``draft``: ``(a, b)`` costs)."""
    (at, bt), (ad, bd) = target, draft
    return tau * (at + bt) / (at + bt * (nodes + 1) + depth * (ad + bd * width))


def tau_needed(speedup: float, nodes: float, depth: float, width: float, target: tuple, draft: tuple) -> float:
    """The τ a round of that shape needs for ``speedup`` at these costs."""
    return speedup / round_speedup(1.0, nodes, depth, width, target, draft)


def best_budget(rows: Sequence[dict[str, Any]], target: tuple, draft: tuple) -> dict[str, Any] | None:
    """Of measured ``rows`` (``label``, ``tau``, ``nodes``, ``depth``, ``width``: per round), the one the
    cost model predicts fastest, with every row's prediction."""
    scored = [
        {**r, "predicted": round_speedup(r["tau"], r["nodes"], r["depth"], r["width"], target, draft)}
        for r in rows
        if r.get("tau")
    ]
    return {"best": max(scored, key=lambda r: r["predicted"]), "rows": scored} if scored else None


def shape_of(stats: Sequence[dict[str, Any]], target: int = 0, draft: int = 1) -> dict[str, float] | None:
    """A run's measured round shape from its generations' stats (``GenerationStats.to_dict``): τ (tokens per
    target forward), nodes (tokens the target verifies per round: fed tokens less the prompt and each
    round's root), drafter forwards per round and tokens per drafter forward (less the prompt)."""
    tokens = sum(s["new_tokens"] for s in stats)
    prompt = sum(s["prompt_tokens"] for s in stats)
    calls = [sum(s["models"][i]["forward_calls"] for s in stats) for i in (target, draft)]
    fed = [sum(s["models"][i]["forwarded_tokens"] for s in stats) for i in (target, draft)]
    if not calls[0] or not calls[1]:
        return None
    return {
        "tau": tokens / calls[0],
        "nodes": max(0.0, (fed[0] - prompt - calls[0] + len(stats)) / calls[0]),
        "depth": calls[1] / calls[0],
        "width": max(1.0, (fed[1] - prompt) / calls[1]),
    }
