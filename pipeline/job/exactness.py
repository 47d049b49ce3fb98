"""Exactness at T=0: does a method emit its baseline's tokens, and when not, is it numerics or a bug?
(docs/exactness.md, "Greedy mismatches in a run").

For each mismatch the target is recomputed in float64 at the first divergent position (each model reloaded on the
CPU, one at a time): within ``near_tie_nats`` between the two tokens it is numerics, else a bug. The check never
fails a cell: when the float64 copies would not fit in memory, or the recompute fails, the mismatches are recorded
as ``unchecked`` with the reason.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from ..errors import UserError, one_line
from ..records import read_record


def first_divergence(a: Sequence[int], b: Sequence[int]) -> int | None:
    """The first index where ``a`` and ``b`` differ (a shorter one ending early counts); None if equal."""
    first = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
    return first if first is not None or len(a) == len(b) else min(len(a), len(b))


def _plan(method: str, method_args: dict, n: int):
    """The method's target members and function (the models' sizes only pick a first proposer: not needed)."""
    from ..decoding.methods import plan_method
    from ..decoding.spec import parse_method

    if reference := parse_method(method).engine.reference:  # vLLM's decoding draws the large model's tokens
        method, method_args = reference, {}
    plan, _ = plan_method(method, [0] * n, 1, dict(method_args))
    return plan


def float64_bytes(spec) -> int:
    """About how much memory ``spec``'s model takes in float64 (its weight files, rescaled)."""
    from ..models import resolve

    path = resolve(spec)
    files = [f for pattern in ("*.safetensors", "*.bin") for f in path.glob(pattern)]
    stored = None  # unknown: float16, 2 bytes a parameter
    with contextlib.suppress(UserError):  # unreadable: counted as float16
        stored = read_record(path / "config.json", "config.json", "model config").get("torch_dtype")
    per_param = {"float32": 4, "float64": 8}.get(str(stored), 2)
    return sum(f.stat().st_size for f in files) * 8 // per_param


def available_bytes() -> int | None:
    """Memory this process can still take: the machine's available memory, within its cgroup's limit."""
    found = []
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                found.append(int(line.split()[1]) * 1024)
    for limit, usage in (
        ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
        ("/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes"),
    ):
        with contextlib.suppress(OSError, ValueError):  # no such file, or "max"
            found.append(int(Path(limit).read_text()) - int(Path(usage).read_text()))
            break
    return min(found) if found else None


@torch.inference_mode()
def target_logprobs(specs, method: str, method_args: dict, contexts: list[list[int]]) -> list[torch.Tensor]:
    """The method's target log-probabilities (greedy: identity warping) after each context, in float64 on the CPU.

    Only the target's models are loaded, one at a time; each head is cropped to the rows the tokenizer's ids
    reach, as the generation job decodes (``models.token_rows``: padding is never part of a distribution).
    """
    from ..decoding.sampling import Sampling
    from ..models import load_spec, tokenizer_rows

    plan = _plan(method, method_args, len(specs))
    rows: dict[int, list[torch.Tensor]] = {}
    for i in plan.members:
        model, tokenizer = load_spec(dataclasses.replace(specs[i], dtype="float64", device="cpu", pack=False))
        crop = tokenizer_rows(tokenizer)
        rows[i] = [model(input_ids=torch.tensor([ctx])).logits[0, -1, :crop] for ctx in contexts]
        del model
    greedy = Sampling.identity()
    return [
        torch.log(plan.target_fn([rows[i][c][None] for i in plan.members], greedy)[0]) for c in range(len(contexts))
    ]


def check(
    rows: list[dict[str, Any]],
    prompts: dict[str, list[int]],
    specs,
    baseline: str,
    baseline_args: dict,
    near_tie_nats: float = 0.1,
) -> dict[str, Any]:
    """The exactness record of a greedy cell: match rate and, per mismatch, position and attribution."""
    divergences = [(r, first_divergence(r["token_ids"], r["baseline"]["token_ids"])) for r in rows]
    mismatches = [(r, pos) for r, pos in divergences if pos is not None]
    record: dict[str, Any] = {
        "compared": len(rows),
        "identical": len(rows) - len(mismatches),
        "rate": (len(rows) - len(mismatches)) / len(rows) if rows else None,
        "mismatches": [],
    }
    if not mismatches:
        return record
    contexts = [prompts[r["id"]] + r["token_ids"][:pos] for r, pos in mismatches]
    try:
        members = _plan(baseline, baseline_args, len(specs)).members
        need, have = max(float64_bytes(specs[i]) for i in members), available_bytes()  # one at a time
        if have is not None and need > 0.8 * have:
            raise MemoryError(f"a float64 copy needs {need / 2**30:.1f} GiB, {have / 2**30:.1f} GiB available")
        logprobs = target_logprobs(specs, baseline, baseline_args, contexts)
    except Exception as err:  # the check must never cost the cell: say why it was not done
        logprobs = [None] * len(mismatches)
        record["unchecked_reason"] = one_line(err)
    for (r, pos), lp in zip(mismatches, logprobs):
        a, b = (ids[pos] if pos < len(ids) else None for ids in (r["token_ids"], r["baseline"]["token_ids"]))
        entry = {"id": r["id"], "position": pos, "method_token": a, "baseline_token": b, "gap_nats": None}
        if lp is None:
            entry["attribution"] = "unchecked"
        elif a is None or b is None:  # one side stopped (EOS, stop string) where the other went on
            entry["attribution"] = "bug"
        else:
            gap = abs(float(lp[a] - lp[b]))
            near = math.isfinite(gap) and gap <= near_tie_nats  # an impossible token is never a near-tie
            entry.update(gap_nats=gap if math.isfinite(gap) else None, attribution="numerics" if near else "bug")
        record["mismatches"].append(entry)
    for kind in ("numerics", "bug", "unchecked"):
        record["bugs" if kind == "bug" else kind] = sum(m["attribution"] == kind for m in record["mismatches"])
    return record
