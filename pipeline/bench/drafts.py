"""Draft losses and data compared on the bundled model: acceptance at T=0 and T=1 against training steps and the
teacher data's size and mix, for the same step budget and seed (docs/proposers.md).
``python -m pipeline.bench.drafts --help``.

The teacher's data is made once per data mix (``--data PROMPTS:CHUNKS``: on-policy prompts the teacher continues,
a generation each, and standard-library source chunks it labels, a prefill each; ``distill.teacher_data``); each
loss then trains its own copy of the teacher's first layers for each step budget (a cosine schedule over that
budget, as a recipe of that many steps would), and one run per loss at the largest budget of the first mix also
measures its held-out acceptance every 50 steps (the learning curve). Every mix is measured on the same held-out
continuations. Prints a Markdown table; ``--json`` records every figure.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import time
from pathlib import Path

from ..errors import UserError
from ..files import write_atomic
from ..models.distill import train_draft
from ..models.recipe import LOSSES, Recipe
from ..models.teacher import teacher_data

COLUMNS = ("agreement", "agreement_with_lookup", "acceptance_t1", "acceptance_t1_with_lookup", "final_loss")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipeline.bench.drafts", description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--head-tokens", type=int, default=Recipe.head_tokens)
    parser.add_argument("--losses", nargs="+", choices=tuple(LOSSES), default=list(LOSSES))
    parser.add_argument("--steps", nargs="+", type=int, default=[200, 400, 800], help="step budgets")
    parser.add_argument("--prompts", type=int, default=Recipe.prompts, help="on-policy prompts (training data)")
    parser.add_argument(
        "--data",
        nargs="+",
        type=data_mix,
        metavar="PROMPTS:CHUNKS",
        help="teacher data mixes: on-policy prompts and source chunks (default: --prompts and the recipe's chunks)",
    )
    parser.add_argument("--chat-every", type=int, default=0, help="every Nth on-policy prompt as a chat turn")
    parser.add_argument("--json", type=Path, help="write every figure here")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    if min(args.steps) < 1 or args.layers < 1 or args.prompts < 1 or args.threads < 1:
        raise UserError(f"--steps {args.steps} --layers {args.layers} --prompts {args.prompts}: expected 1 or more")
    import torch

    from ..models import BUNDLED, ModelSpec, load_spec
    from ..models.cpu_kernels import pack_linears
    from ..models.loading import truncated_copy

    torch.set_num_threads(args.threads)
    teacher, tokenizer = load_spec(ModelSpec(BUNDLED, pack=False))
    recipe = Recipe(layers=args.layers, head_tokens=args.head_tokens, prompts=args.prompts, chat_every=args.chat_every)
    base = truncated_copy(teacher, args.layers)
    pack_linears(teacher)
    rows, curves = [], {}
    mixes = args.data or [(recipe.prompts, recipe.source_chunks)]
    for m, (prompts, chunks) in enumerate(mixes):
        mixed = dataclasses.replace(recipe, prompts=prompts, source_chunks=chunks)
        data = teacher_data(teacher, tokenizer, mixed)
        for loss in args.losses:
            for steps in sorted(args.steps):
                run = dataclasses.replace(mixed, loss=loss, steps=steps)
                last = steps == max(args.steps) and m == 0
                _, facts = train_draft(copy.deepcopy(base), data, run, curve=last)
                if last:
                    curves[loss] = facts.pop("curve")
                shown = {k: facts[k] for k in (*COLUMNS, "train_seconds")}
                mix = {"prompts": prompts, "chunks": chunks, "sequences": len(data.examples)}
                rows.append({"loss": loss, "steps": steps, **mix, "teacher_seconds": data.seconds, **shown})
                print(table_row(rows[-1]), flush=True)
    print(render(rows, curves, recipe, data))
    if args.json:
        record = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "recipe": dataclasses.asdict(recipe),
            "threads": args.threads,
            "teacher_seconds": data.seconds,
            "train_sequences": len(data.examples),
            "eval_tokens": sum(len(c) for _, c, _ in data.held),
            "rows": rows,
            "curves": curves,
        }
        args.json.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(args.json, json.dumps(record, indent=2) + "\n")
    return 0


def data_mix(text: str) -> tuple[int, int]:
    """``PROMPTS:CHUNKS`` (``64:16``): on-policy prompts (1 or more) and source chunks (0 or more)."""
    prompts, _, chunks = text.partition(":")
    try:
        mix = int(prompts), int(chunks)
    except ValueError:
        mix = (0, -1)
    if mix[0] < 1 or mix[1] < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: expected PROMPTS:CHUNKS, e.g. 64:16 (prompts >= 1, chunks >= 0)")
    return mix


def table_row(r: dict) -> str:
    cells = [f"{r[c]:.1%}" for c in COLUMNS[:4]] + [f"{r['final_loss']:.3f}", f"{r['train_seconds']:.0f}"]
    data = f"{r['prompts']}+{r['chunks']} ({r['sequences']})"
    return f"| {r['loss']} | {r['steps']} | {data} | {r['teacher_seconds']:.0f} | " + " | ".join(cells) + " |"


def render(rows: list[dict], curves: dict, recipe: Recipe, data) -> str:
    eval_tokens = sum(len(c) for _, c, _ in data.held)
    lines = [
        f"Draft: the bundled model's first {recipe.layers} layers, head {recipe.head_tokens or 'full'}; "
        f"{eval_tokens} held-out tokens.",
        "",
        "| loss | steps | data: prompts+chunks (sequences) | teacher s | T=0 alone | T=0 with lookup | T=1 alone "
        "| T=1 with lookup | final loss | train s |",
        "|---|---|---|---|---|---|---|---|---|---|",
        *(table_row(r) for r in rows),
        "",
        "Learning curve (T=0 alone / T=1 alone) by step:",
        "",
        "| step | " + " | ".join(curves) + " |",
        "|---|" + "---|" * len(curves),
    ]
    steps = [c["step"] for c in next(iter(curves.values()), [])]
    for i, step in enumerate(steps):
        cells = [f"{c[i]['agreement']:.1%} / {c[i]['acceptance_t1']:.1%}" for c in curves.values()]
        lines.append(f"| {step} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    import sys

    try:
        sys.exit(main())
    except UserError as err:
        sys.exit(f"error: {err}")
