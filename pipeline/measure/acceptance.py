"""What the decoder's counts over a cell's samples say (``speed.py`` puts each in the cell's summary): τ (mean
accepted length), the acceptance rates, the cost of mapping rows into a union vocabulary and the speed-up the
counted forwards predict, as ``docs/speed.md`` defines them ("τ and acceptance, by the field's names")."""

from __future__ import annotations

from itertools import zip_longest
from typing import Any


def _sum_lists(lists: list[list[int]]) -> list[int]:
    """Element-wise sums of lists of different lengths (a missing entry counts 0)."""
    return [sum(column) for column in zip_longest(*lists, fillvalue=0)]


def _per_model(stats: list[dict[str, Any]], key: str, n: int) -> list:
    """``key`` of each of the first ``n`` models, summed over samples (a sample without that model counts 0)."""
    return [sum(s["models"][i][key] for s in stats if i < len(s["models"])) for i in range(n)]


def decoding_metrics(stats: list[dict[str, Any]]) -> dict[str, Any]:
    """τ (overall and per model), acceptance rates and per-position acceptance over a cell's samples."""
    tokens = sum(s["new_tokens"] for s in stats)
    calls = _per_model(stats, "forward_calls", max((len(s["models"]) for s in stats), default=0))
    tau_by_model = [tokens / c if c else None for c in calls]
    proposers = [m for s in stats for m in [*s["models"], *s.get("proposers", {}).values()]]
    proposed = sum(m["proposed"] for m in proposers)
    verified = sum(m["verified"] for m in proposers)
    accepted = sum(m["accepted"] for m in proposers)
    reached = _sum_lists([s.get("position_verified", []) for s in stats])
    hits = _sum_lists([s.get("position_accepted", []) for s in stats])
    return {
        "tau": tau_by_model[0] if tau_by_model else None,
        "tau_by_model": tau_by_model,
        "acceptance_rate": accepted / verified if verified else None,
        "draft_acceptance_rate": accepted / proposed if proposed else None,
        "position_acceptance": [a / r if r else None for a, r in zip(hits, reached)],
    }


def union_metrics(stats: list[dict[str, Any]]) -> dict[str, Any]:
    """Models with different tokenizers: the union vocabulary's size and the seconds spent mapping the members'
    rows into it, over the cell's samples (None for one shared vocabulary)."""
    size = max((s.get("union_size") or 0 for s in stats), default=0)
    if not size:
        return {"union_size": None, "union_map_s": None}
    return {"union_size": size, "union_map_s": sum(s.get("union_map_s") or 0.0 for s in stats)}


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
    calls_m, time_m = _per_model(method, "forward_calls", n), _per_model(method, "forward_time_s", n)
    calls_b, time_b = _per_model(base, "forward_calls", n), _per_model(base, "forward_time_s", n)
    tokens_m, tokens_b = sum(s["new_tokens"] for s in method), sum(s["new_tokens"] for s in base)
    cost = [time_b[i] / calls_b[i] if calls_b[i] else time_m[i] / calls_m[i] if calls_m[i] else 0.0 for i in range(n)]
    per_token_m = sum(c * k for c, k in zip(cost, calls_m)) / tokens_m if tokens_m else 0
    per_token_b = sum(c * k for c, k in zip(cost, calls_b)) / tokens_b if tokens_b else 0
    return per_token_b / per_token_m if per_token_m and per_token_b else None
