"""The speed-up cost model, in one place: what a speculative round costs against the target decoding alone.

Every prediction here is one ratio (``speedup``): a round emits ``τ`` tokens for the cost of its forwards, the
target alone emits one token per forward of one token, so

    speed-up = τ · cost(target forward of 1) / cost(round)

What differs is how ``τ`` and the round's cost are known:

* ``predicted_speedup``: counted forwards of a measured run, each priced at the model's measured cost of one
  forward (the cell's ``predicted_speedup``, docs/speed.md);
* ``chain_speedup``: a chain of ``γ`` drafts accepted independently with probability ``a`` (the expected
  ``τ = (1 - a^(γ+1)) / (1 - a)``), at forward costs timed per ``k`` new tokens (``bench/runners.py``, and the
  forecast ``experiment/estimate.py``);
* ``round_speedup``: a token tree with ``N`` nodes, ``D`` drafter forwards of ``w`` tokens, at costs that are a
  line ``a + b k`` in the ``k`` new tokens of a forward (``fit``, through forwards timed over a context,
  ``forward_timing.forward_costs``):

      speed-up = τ (a_t + b_t) / (a_t + b_t (N + 1) + D (a_d + b_d w))

  A chain of ``γ`` is the same with ``N = γ``, ``D = γ``, ``w = 1``. Where ``b_t`` is small against ``a_t`` (a
  GPU at batch size 1), extra nodes are nearly free and the best budget is large; on a CPU each node costs
  ``b_t / a_t`` of a forward and the best budget is small (``best_budget``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .acceptance import per_model


def fit(costs: dict[int, float]) -> tuple[float, float]:
    """``(a, b)``: the least-squares line ``a + b k`` through measured costs of forwards of ``k`` tokens
    (``forward_timing.forward_costs``; at least two sizes), ``b`` at least 0."""
    n = len(costs)
    mk, mt = sum(costs) / n, sum(costs.values()) / n
    var = sum((k - mk) ** 2 for k in costs)
    b = max(0.0, sum((k - mk) * (t - mt) for k, t in costs.items()) / var) if var else 0.0
    return max(mt - b * mk, 0.0), b


def speedup(tokens: float, cost: float, one: float) -> float:
    """The speed-up of ``tokens`` emitted for ``cost`` over the target alone, whose token costs ``one``."""
    return tokens * one / cost


def expected_tokens(a: float, gamma: int) -> float:
    """Tokens a round of a chain of ``gamma`` drafts emits when each is accepted independently with probability
    ``a``: the accepted prefix plus the target's own token."""
    return (1 - a ** (gamma + 1)) / (1 - a) if a < 1 else gamma + 1


def chain_speedup(a: float, gamma: int, target_cost: dict[int, float], draft_cost: dict[int, float]) -> float:
    """A chain of ``gamma`` at acceptance ``a``: ``gamma`` draft forwards of one token and one target forward of
    ``gamma + 1`` (the nearest size timed) per round; costs are seconds per forward by new tokens."""
    k = min(target_cost, key=lambda x: abs(x - (gamma + 1)))
    return speedup(expected_tokens(a, gamma), gamma * draft_cost[1] + target_cost[k], target_cost[1])


def round_speedup(tau: float, nodes: float, depth: float, width: float, target: tuple, draft: tuple) -> float:
    """The speed-up over the target alone of rounds of ``nodes`` verified tokens, ``depth`` drafter forwards of
    ``width`` tokens each, emitting ``tau`` tokens per round (``target``, ``draft``: ``(a, b)`` costs)."""
    (at, bt), (ad, bd) = target, draft
    return speedup(tau, at + bt * (nodes + 1) + depth * (ad + bd * width), at + bt)


def tau_needed(goal: float, nodes: float, depth: float, width: float, target: tuple, draft: tuple) -> float:
    """The τ a round of that shape needs for a speed-up of ``goal`` at these costs."""
    return goal / round_speedup(1.0, nodes, depth, width, target, draft)


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


def predicted_speedup(rows: list[dict[str, Any]]) -> float | None:
    """Speed-up predicted from counted forwards and measured per-forward costs (side-by-side rows).

    Each model's cost of one forward is measured in the baseline run (where it
    decodes one token per forward), else in the method's own run. The
    prediction prices every forward of the method at that cost, i.e. assumes
    a forward of k new tokens costs what a forward of one does and the loop
    costs nothing; the gap to the measured speed-up is what those assumptions
    miss on this hardware. A stall inflates the baseline's costs and the
    method's alike, so the prediction is a check on the measured ratio.
    """
    if not rows or any("baseline" not in r for r in rows):
        return None
    method, base = [r["stats"] for r in rows], [r["baseline"]["stats"] for r in rows]
    n = max(len(s["models"]) for s in method)
    calls_m, time_m = per_model(method, "forward_calls", n), per_model(method, "forward_time_s", n)
    calls_b, time_b = per_model(base, "forward_calls", n), per_model(base, "forward_time_s", n)
    tokens_m, tokens_b = sum(s["new_tokens"] for s in method), sum(s["new_tokens"] for s in base)
    cost = [time_b[i] / calls_b[i] if calls_b[i] else time_m[i] / calls_m[i] if calls_m[i] else 0.0 for i in range(n)]
    round_m, round_b = sum(c * k for c, k in zip(cost, calls_m)), sum(c * k for c, k in zip(cost, calls_b))
    if not (tokens_m and tokens_b and round_m and round_b):
        return None
    return speedup(1.0, round_m / tokens_m, round_b / tokens_b)  # a token, at each run's cost per token
