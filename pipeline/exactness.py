"""Exactness at T=0: does a method emit its baseline's tokens, and when not, is it numerics or a bug?

A speculative method computes its target from forwards of k tokens, its
baseline from forwards of one; in float32 and float64 on a CPU both round
alike and every greedy output must equal the baseline's (Spec-Bench's
equality check). In bfloat16 they round differently, so outputs may part
where two tokens are nearly tied without any algorithmic error. For each
mismatch this module finds the first divergent position and recomputes the
target there in float64 (each model reloaded on the CPU, one at a time), from
the shared prefix: when the two tokens' target log-probabilities lie within
``near_tie_nats`` of each other the mismatch is attributed to numerics,
otherwise it is reported as a bug.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import torch


def first_divergence(a: Sequence[int], b: Sequence[int]) -> int | None:
    """The first index where ``a`` and ``b`` differ (a shorter one ending early counts); None if equal."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


@torch.inference_mode()
def target_logprobs(specs, method: str, method_args: dict, contexts: list[list[int]]) -> list[torch.Tensor]:
    """The method's target distribution (greedy: identity warping) after each context, in float64 on the CPU."""
    from .decoding.methods import plan_method
    from .decoding.sampling import Sampling
    from .models import load_spec

    rows: dict[int, list[torch.Tensor]] = {}
    plan = None
    for i, spec in enumerate(specs):
        model, _ = load_spec(dataclasses.replace(spec, dtype="float64", device="cpu", pack=False))
        if plan is None:
            plan, _ = plan_method(method, [model] * len(specs), 1, dict(method_args))
        if i in plan.members:
            rows[i] = [model(input_ids=torch.tensor([ctx])).logits[0, -1] for ctx in contexts]
        del model
    out = []
    for c in range(len(contexts)):
        probs = plan.target_fn([rows[i][c][None] for i in plan.members], Sampling.identity())[0]
        out.append(torch.log(probs))
    return out


def check(
    rows: list[dict[str, Any]],
    prompts: dict[str, list[int]],
    specs,
    baseline: str,
    baseline_args: dict,
    near_tie_nats: float = 0.1,
) -> dict[str, Any]:
    """The exactness record of a greedy cell: match rate and, per mismatch, position and attribution."""
    mismatches = []
    for r in rows:
        pos = first_divergence(r["token_ids"], r["baseline"]["token_ids"])
        if pos is not None:
            mismatches.append((r, pos))
    record: dict[str, Any] = {
        "compared": len(rows),
        "identical": len(rows) - len(mismatches),
        "rate": (len(rows) - len(mismatches)) / len(rows) if rows else None,
        "mismatches": [],
    }
    if not mismatches:
        return record
    contexts = [prompts[r["id"]] + r["token_ids"][:pos] for r, pos in mismatches]
    logprobs = target_logprobs(specs, baseline, baseline_args, contexts)
    for (r, pos), lp in zip(mismatches, logprobs):
        a = r["token_ids"][pos] if pos < len(r["token_ids"]) else None
        b = r["baseline"]["token_ids"][pos] if pos < len(r["baseline"]["token_ids"]) else None
        entry = {"id": r["id"], "position": pos, "method_token": a, "baseline_token": b}
        if a is None or b is None:  # one side stopped (EOS, stop string) where the other went on
            entry.update(gap_nats=None, attribution="bug")
        else:
            gap = abs(float(lp[a] - lp[b]))
            entry.update(gap_nats=gap, attribution="numerics" if gap <= near_tie_nats else "bug")
        record["mismatches"].append(entry)
    record["numerics"] = sum(m["attribution"] == "numerics" for m in record["mismatches"])
    record["bugs"] = len(record["mismatches"]) - record["numerics"]
    return record
