"""How often the proposers that cost no forward hold the target's greedy token, position by position.

    python -m pipeline.bench.positions --prompts 40                  # HumanEval prompts no default cell measures
    python -m pipeline.bench.positions --dataset spec_bench --prompts 24

At T = 0 a chain's τ is bounded by how often its proposer names the target's next token. This replays the bundled
model's greedy output on held-out prompts (``methods.heldout_prompts``) and asks, at every output position with
the true context before it, what ``suffix`` (its first and further candidates, from the context and the bench's
corpus) and ``recycle`` (its table's candidates, filled from the target's rows at the positions before) propose,
as a generation at that position would: the share of positions whose token is among them. No timing: one greedy
generation and one forward per prompt; the corpus takes each prompt's output once it is done, as a job's does.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter

import torch

from pipeline.bench.methods import MEASURED, bench_corpus, heldout_prompts
from pipeline.decoding import generate
from pipeline.decoding.corpus import Corpus
from pipeline.decoding.proposers.recycle import TOP, TokenRecycling
from pipeline.decoding.proposers.suffix import SuffixProposer
from pipeline.errors import ArgumentError
from pipeline.models import ModelError, cpu_kernels, load_bundled

ROWS = (  # (label, what holds the token at a position)
    ("suffix, first candidate", lambda s, r: s[:1]),
    ("suffix, any of 3", lambda s, r: s[:3]),
    ("recycle, first candidate", lambda s, r: r[:1]),
    ("recycle, any of 4", lambda s, r: r[:4]),
    ("suffix+recycle (the chain's proposal)", lambda s, r: s[:1] or r[:1]),
    ("suffix's first and recycle's first", lambda s, r: s[:1] + r[:1]),
    ("suffix's first and recycle's 4", lambda s, r: s[:1] + r[:4]),
)


def replay(target, prompts: list[list[int]], max_new: int, eos, corpus: Corpus) -> tuple[Counter, int]:
    """Hits by row over every output position of every prompt, and the number of positions."""
    hits, positions = Counter(), 0
    for i, ids in enumerate(prompts):
        out = generate([target], ids, "large_model", max_new_tokens=max_new, eos_token_id=eos).token_ids
        with torch.inference_mode():
            rows = target(torch.tensor([ids + out])).logits[0, len(ids) - 1 : -1].softmax(dim=-1)
        top = rows.topk(TOP, dim=-1).indices.tolist()
        view = corpus.view(str(i))
        suffix, recycle = SuffixProposer(view), TokenRecycling(view)
        full = ids + out
        for t, token in enumerate(out):
            context = full[: len(ids) + t]
            suffix.feed(context, len(context))
            s, r = suffix.continuations(context, 3), recycle.continuations(context, 4)
            for label, held in ROWS:
                hits[label] += token in held(s, r)
            recycle.table[context[-1]] = top[t]  # the row a verification at this position computes
            positions += 1
        recycle.close()
        corpus.add_output(str(i), out)
    return hits, positions


def render(hits: Counter, positions: int) -> str:
    lines = ["| proposes the target's token | share of positions |", "|---|---|"]
    lines += [f"| {label} | {hits[label] / positions:.1%} |" for label, _ in ROWS]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pipeline.bench.positions", description=__doc__.split("\n\n")[0])
    ap.add_argument("--dataset", choices=["humaneval", "spec_bench"], default="humaneval")
    ap.add_argument("--prompts", type=int, default=40, help=f"held-out prompts (after the first {MEASURED})")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--corpus", choices=["teacher", "outputs"], default="teacher", help="as the bench's --corpus")
    args = ap.parse_args(argv)
    try:
        target, tokenizer = load_bundled(pack=False)
        if cpu_kernels.available():
            cpu_kernels.pack_linears(target)
        prompts = [tokenizer(p).input_ids for p in heldout_prompts(args.dataset, args.prompts, tokenizer, True)]
        corpus = bench_corpus(2, len(tokenizer)) if args.corpus == "teacher" else Corpus()
    except (ArgumentError, ModelError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    hits, positions = replay(target, prompts, args.max_new_tokens, tokenizer.eos_token_id, corpus)
    print(f"{len(prompts)} {args.dataset} prompts no default cell measures, {positions} greedy output positions")
    print(render(hits, positions))
    return 0


if __name__ == "__main__":
    sys.exit(main())
