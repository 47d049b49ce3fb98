"""The benchmark's table from its measured totals: each variant's speed-up over its group's baseline with its
interval, τ, acceptance, the cost model's prediction, and the comparisons (ours against transformers' methods, a
tree against the chain of its node budget, a dynamic gamma against the fastest fixed one, best against best)."""

from __future__ import annotations

import sys
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pipeline.bench.variants import Variant, same_budget_chain
from pipeline.decoding.spec import PEERS, parse_method
from pipeline.measure.acceptance import decoding_metrics
from pipeline.measure.cost import predicted_speedup
from pipeline.measure.speed import fmt as speed_fmt
from pipeline.measure.speed import series_speedup, speedup_ratio


@dataclass
class Totals:
    tokens: int = 0
    wall: float = 0.0
    forward: float = 0.0
    verified: int = 0
    accepted: int = 0
    target_calls: int = 0
    model_forward: list = field(default_factory=lambda: [0.0, 0.0])  # seconds inside the target's, the draft's forwards
    proposing: float = 0.0  # seconds the named proposers spent (no network of the set: lookups, tables, automata)
    accepting: float = 0.0  # seconds in the acceptance rule and the target's draws
    trimming: float = 0.0  # seconds cutting the caches back after rejections
    profiled: bool = True  # our decoder's runs (another engine's stats split nothing outside its forwards)
    outputs: list = field(default_factory=list)  # the new tokens of each prompt, in prompt order
    per_prompt: list = field(default_factory=list)  # (tokens, wall) of each prompt, in prompt order
    stats: list = field(default_factory=list)  # the decoder's stats of each prompt, in prompt order

    def add(self, r: Any) -> None:
        """One prompt's generation (a ``GenerationResult``)."""
        s = r.stats
        self.tokens += len(r.token_ids)
        self.wall += s.wall_time_s
        self.forward += s.forward_time_s
        self.verified += sum(m.verified for m in s.models) + sum(p.verified for p in s.proposers.values())
        self.accepted += s.accepted or 0  # None for transformers' methods: not counted
        self.target_calls += s.models[0].forward_calls
        for j, m in enumerate(s.models[:2]):
            self.model_forward[j] += m.forward_time_s
        self.proposing += sum(p.propose_time_s for p in s.proposers.values())
        self.profiled = self.profiled and s.rounds is not None  # transformers' generate counts no rounds
        self.accepting += s.accept_time_s
        self.trimming += s.trim_time_s
        self.per_prompt.append((len(r.token_ids), s.wall_time_s))
        self.stats.append(s.to_dict())
        self.outputs.append(r.token_ids)


def measure(
    runs: list[tuple[str, Callable]], prompts: list[list[int]], max_new: int, warm_up: int, desc=None, done=None
):
    """Totals by label of every run (``(label, run)``, ``run(ids, max_new_tokens, seed)`` a ``GenerationResult``)
    over every prompt, in an order rotated per prompt so that no run always goes first, after an untimed warm-up
    of ``warm_up`` tokens on the first prompt; ``desc``: a progress bar on stderr; ``done(i, results)``, if given,
    is called once prompt ``i`` has run every run (its results by label)."""
    from tqdm import tqdm

    for _, run in runs:  # warm-up, not timed
        run(prompts[0], warm_up, 0)
    totals: dict[str, Totals] = defaultdict(Totals)
    with tqdm(total=len(prompts) * len(runs), desc=desc, unit="run", file=sys.stderr, disable=desc is None) as bar:
        for i, ids in enumerate(prompts):
            results = {}
            for label, run in runs[i % len(runs) :] + runs[: i % len(runs)]:
                results[label] = run(ids, max_new, i)
                totals[label].add(results[label])
                bar.update()
            if done is not None:
                done(i, results)
    return totals


def _speedup(t: Totals, base: Totals) -> tuple[float, list[float | None]]:
    """``t``'s speed over ``base``'s with its paired-bootstrap interval over prompts, ``[low, high]``."""
    ratio, low, high = series_speedup(t.per_prompt, base.per_prompt)
    return ratio, [low, high]


def best_fixed(v: Variant, vs: list[Variant], totals: dict[str, Totals]) -> Variant | None:
    """For a dynamic-gamma variant: the fixed-gamma variant of its method and group with the most tokens/s.

    Picked after the fact, so the comparison leans towards the fixed gamma (the best of several noisy estimates).
    """
    if v.gamma_schedule == "fixed":
        return None
    key = (v.group, v.method, "fixed", None, v.method_args)  # its own proposer's
    fixed = [w for w in vs if (w.group, w.method, w.gamma_schedule, w.tree, w.method_args) == key]
    return max(fixed, key=lambda w: totals[w.label].tokens / totals[w.label].wall, default=None)


def table(vs: list[Variant], totals: dict[str, Totals]) -> list[dict]:
    rows = []
    base = {v.group: totals[v.label] for v in vs if v.baseline}
    for v in vs:
        t = totals[v.label]
        speedup, ci = _speedup(t, base[v.group])
        same = sum(tokens == ref for tokens, ref in zip(t.outputs, base[v.group].outputs))  # token for token (greedy)
        pairs = [{"stats": m, "baseline": {"stats": b}} for m, b in zip(t.stats, base[v.group].stats)]
        metrics = decoding_metrics(t.stats)  # the ceiling and the proposers' cost, as a cell's speed record has them
        row = {
            "group": v.group,
            "method": v.label,
            "tokens": t.tokens,
            "tok_per_s": t.tokens / t.wall,
            "speedup": speedup,
            "speedup_ci": ci,
            "acceptance": t.accepted / t.verified if t.verified else None,
            "tau": t.tokens / t.target_calls if t.target_calls else None,
            "overhead": 1 - t.forward / t.wall,
            "outside_forward": round_profile(t),
            "time_split": {"target": t.model_forward[0] / t.wall, "draft": t.model_forward[1] / t.wall},
            "predicted": None if t is base[v.group] else predicted_speedup(pairs),  # counted forwards, measured costs
            "per_prompt": t.per_prompt,  # (tokens, wall s) per prompt: any two rows' ratio with its interval
            "identical": f"{same}/{len(t.outputs)}" if v.temperature == 0 else "-",
            **{k: metrics[k] for k in ("ceiling", "proposal_cost")},
        }
        named = f"{parse_method(v.method).ours} g={v.gamma}"  # in a sweep of proposers: the first one's
        ours = next((label for label in totals if label == named or label.startswith(f"{named} ")), None)
        if ours is not None:  # a peer: our method doing the same job, same gamma, over it
            row["ours_vs_hf"], row["ours_vs_hf_ci"] = _speedup(totals[ours], t)
        chain = same_budget_chain(v, vs)
        if chain is not None:  # a tree against the chain of its node budget, same prompts
            ratio, ci = _speedup(t, totals[chain.label])
            tau = totals[chain.label].tokens / totals[chain.label].target_calls
            row["vs_chain"] = {"chain": chain.label, "ratio": ratio, "ci": ci, "tau_ratio": row["tau"] / tau}
        best = best_fixed(v, vs, totals)
        if best is not None:  # a dynamic gamma against the fastest fixed gamma of its method, same prompts
            ratio, ci = _speedup(t, totals[best.label])
            row["vs_best_fixed"] = {"fixed": best.label, "ratio": ratio, "ci": ci}
        rows.append(row)
    return rows


def round_profile(t: Totals) -> dict[str, float]:
    """Where a run's time outside the models' forwards went, each as a share of its wall time: proposing (the
    named proposers), the acceptance rule and the target's draws, cutting caches back, and the rest (the loop's
    own bookkeeping, stop checks, the targets' rows gathered and warped)."""
    outside = t.wall - t.forward
    if not t.profiled:  # another engine's generate: only its total outside the forwards is known
        return {"outside": outside / t.wall}
    parts = {"proposing": t.proposing, "accepting": t.accepting, "trimming": t.trimming}
    shares = {k: v / t.wall for k, v in parts.items()}
    shares["rest"] = (outside - sum(parts.values())) / t.wall
    shares["outside"] = outside / t.wall
    return shares


def render_profile(rows: list[dict]) -> str:
    """The share of each variant's wall time outside the models' forwards, and where it went."""
    out = [
        "| variant | outside the forwards | proposing | acceptance and draws | cache trimming | rest of the loop |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        p = r["outside_forward"]
        cells = [f"{p[k]:.1%}" if k in p else "-" for k in ("outside", "proposing", "accepting", "trimming", "rest")]
        out.append(f"| {r['method']} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def tree_costs(
    vs: list[Variant], totals: dict[str, Totals], target, draft, goal: float = 1.35, repeats: int = 5
) -> list[str]:
    """With tree rows in the sd group: the cost model (``cost.py``) at forward costs timed now (k = 1 up
    to the largest round), each sd row's predicted speed-up from its measured τ and round shape, the best, and
    the τ the best tree's shape needs for ``goal``."""
    from pipeline.measure import cost
    from pipeline.measure.forward_timing import forward_costs

    group = [v for v in vs if v.group == vs[0].group and v.method == "sd"]
    if not any(v.tree for v in group):
        return []
    rows = [{"label": v.label, **(cost.shape_of(totals[v.label].stats) or {})} for v in group]
    top = max(2, round(max(r.get("nodes", 1) for r in rows)) + 1)
    ks = sorted({1, 2, (1 + top) // 2, top})
    costs = [cost.fit(forward_costs(m, "eager", ks, context=128, repeats=repeats)) for m in (target, draft)]
    found = cost.best_budget(rows, *costs)
    if found is None:
        return []
    (at, bt), (ad, bd) = costs
    lines = [
        f"cost model: target forward {at:.1f} + {bt:.2f}·k ms, draft {ad:.1f} + {bd:.2f}·k ms (k = {ks} timed now)"
    ]
    for r in found["rows"]:
        t = totals[r["label"]]
        target_s, draft_s = (s / t.wall for s in t.model_forward)
        lines.append(
            f"  {r['label']:18} τ {r['tau']:.2f}, {r['nodes']:.1f} nodes and {r['depth']:.1f} draft forwards of "
            f"{r['width']:.1f} tokens per round: predicted {r['predicted']:.2f}x; wall time in target forwards "
            f"{target_s:.0%}, draft forwards {draft_s:.0%}, the rest {1 - target_s - draft_s:.0%}"
        )
    best = found["best"]
    lines.append(f"cost model's best of these: {best['label']} ({best['predicted']:.2f}x)")
    trees = [r for r in found["rows"] if " t" in r["label"]]
    if trees:
        top = max(trees, key=lambda r: r["predicted"])
        need = cost.tau_needed(goal, top["nodes"], top["depth"], top["width"], *costs)
        lines.append(f"{top['label']} needs τ {need:.2f} for {goal:.2f}x at these costs (measured {top['tau']:.2f})")
    return lines


def best_against_best(vs: list[Variant], totals: dict[str, Totals]) -> dict | None:
    """Our fastest speculative variant against transformers' fastest, each as its speed-up over its group's
    baseline (so ``we_se`` over ``we`` meets ``hf_assisted`` over ``large_model``), with a paired interval."""
    base = {v.group: totals[v.label] for v in vs if v.baseline}

    def speedup(v: Variant) -> float:
        return _speedup(totals[v.label], base[v.group])[0]

    spec = [v for v in vs if not v.baseline and parse_method(v.method).speculative]
    ours = [v for v in spec if v.method not in PEERS and not v.group.startswith("cd")]  # no peer does CD
    peers = [v for v in spec if v.method in PEERS]
    if not ours or not peers:
        return None
    a, b = max(ours, key=speedup), max(peers, key=speedup)
    ratio = speedup_ratio(
        totals[a.label].per_prompt, base[a.group].per_prompt, totals[b.label].per_prompt, base[b.group].per_prompt
    )
    return {"ours": a.label, "peer": b.label, "ratio": ratio[0], "ratio_ci": list(ratio[1:])}


def render_table(rows: list[dict]) -> str:
    def fmt(x, spec):
        return "-" if x is None else format(x, spec)

    head = (
        f"| {'group':8} | {'method':18} | tok/s | {'speed-up [95% interval]':23} | predicted | accept | ceiling "
        "|    τ | overhead | prop. cost | same as baseline |"
    )
    lines = [head, "|" + "|".join("-" * (len(c)) for c in head.split("|")[1:-1]) + "|"]
    for r in rows:
        extra = f" (ours {speed_fmt(r['ours_vs_hf'], *r['ours_vs_hf_ci'])})" if "ours_vs_hf" in r else ""
        if "vs_best_fixed" in r:
            b = r["vs_best_fixed"]
            extra += f" (over {b['fixed']}: {speed_fmt(b['ratio'], *b['ci'])})"
        if "vs_chain" in r:
            c = r["vs_chain"]
            extra += f" (over {c['chain']}: {speed_fmt(c['ratio'], *c['ci'])}, τ {c['tau_ratio']:.2f}x)"
        speedup = speed_fmt(r["speedup"], *r["speedup_ci"])
        lines.append(
            f"| {r['group']:8} | {r['method']:18} | {r['tok_per_s']:5.1f} | {speedup:23} | "
            f"{fmt(r['predicted'], '8.2f') + 'x' if r['predicted'] else '-':>9} | "
            f"{fmt(r['acceptance'], '6.1%')} | {fmt(r.get('ceiling'), '7.1%')} | {fmt(r['tau'], '4.2f')} | "
            f"{fmt(r['overhead'], '8.1%')} | {fmt(r.get('proposal_cost'), '10.2%')} | {r['identical']}{extra} |"
        )
    return "\n".join(lines)
