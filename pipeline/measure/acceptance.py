"""What the decoder's counts over a cell's samples say (``speed.py`` puts each in the cell's summary): τ (mean
accepted length), the acceptance rates and the cost of mapping rows into a union vocabulary, as ``docs/speed.md``
defines them ("τ and acceptance, by the field's names"). The speed-up the counted forwards predict: ``cost.py``."""

from __future__ import annotations

from itertools import zip_longest
from typing import Any


def _sum_lists(lists: list[list[int]]) -> list[int]:
    """Element-wise sums of lists of different lengths (a missing entry counts 0)."""
    return [sum(column) for column in zip_longest(*lists, fillvalue=0)]


def per_model(stats: list[dict[str, Any]], key: str, n: int) -> list:
    """``key`` of each of the first ``n`` models, summed over samples (a sample without that model counts 0)."""
    return [sum(s["models"][i][key] for s in stats if i < len(s["models"])) for i in range(n)]


def decoding_metrics(stats: list[dict[str, Any]]) -> dict[str, Any]:
    """τ (overall and per model), acceptance rates and per-position acceptance over a cell's samples."""
    tokens = sum(s["new_tokens"] for s in stats)
    calls = per_model(stats, "forward_calls", max((len(s["models"]) for s in stats), default=0))
    tau_by_model = [tokens / c if c else None for c in calls]
    proposers = [m for s in stats for m in [*s["models"], *s.get("proposers", {}).values()]]
    proposed = sum(m["proposed"] for m in proposers)
    verified = sum(m["verified"] for m in proposers)
    accepted = sum(m["accepted"] for m in proposers)
    reached = _sum_lists([s.get("position_verified", []) for s in stats])
    hits = _sum_lists([s.get("position_accepted", []) for s in stats])
    positions = sum(s.get("ceiling_positions", 0) for s in stats)
    return {
        "tau": tau_by_model[0] if tau_by_model else None,
        "tau_by_model": tau_by_model,
        "acceptance_rate": accepted / verified if verified else None,
        "draft_acceptance_rate": accepted / proposed if proposed else None,
        "ceiling": sum(s.get("ceiling_sum", 0.0) for s in stats) / positions if positions else None,
        "proposal_cost": proposal_cost(stats),
        "position_acceptance": [a / r if r else None for a, r in zip(hits, reached)],
    }


def proposal_cost(stats: list[dict[str, Any]]) -> float | None:
    """The seconds the named proposers (those outside the set's models: ``lookup``, ``suffix``, ``recycle``, which run
    no network, and a feature head's ``eagle``) spent per proposed token, over the seconds of one forward of the
    large model: what a drafted token costs beside what it can save (None: no such proposer proposed, or none
    recorded its time)."""
    named = [
        p for s in stats for p in s.get("proposers", {}).values() if p.get("propose_time_s") or p.get("forward_time_s")
    ]
    proposed = sum(p["proposed"] for p in named)
    calls = sum(s["models"][0]["forward_calls"] for s in stats if s["models"])
    forward = sum(s["models"][0]["forward_time_s"] for s in stats if s["models"])
    if not proposed or not calls or not forward:
        return None
    spent = sum(p.get("propose_time_s", 0.0) + p.get("forward_time_s", 0.0) for p in named)
    return spent / proposed / (forward / calls)


def union_metrics(stats: list[dict[str, Any]]) -> dict[str, Any]:
    """Models with different tokenizers: the union vocabulary's size and the seconds spent mapping the members'
    rows into it, over the cell's samples (None for one shared vocabulary)."""
    size = max((s.get("union_size") or 0 for s in stats), default=0)
    if not size:
        return {"union_size": None, "union_map_s": None}
    return {"union_size": size, "union_map_s": sum(s.get("union_map_s") or 0.0 for s in stats)}
