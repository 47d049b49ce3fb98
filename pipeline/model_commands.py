"""The ``pipeline`` subcommands about models: list them, distil a draft, make one ready for the workflow."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from .commands import arg, command, named_options


@command(
    "models",
    "list models: parameters, vocabulary, dtype, device, ms per forward",
    arg(
        "--model",
        action="append",
        default=[],
        metavar="NAME[=SOURCE]",
        help="a model (repeatable); default: the default config's models",
    ),
)
def cmd_models(args: argparse.Namespace) -> int:
    from .decoding.runner import engine_of
    from .forward_timing import forward_costs
    from .models import default_models, load_spec, parse_model

    specs = [parse_model(m) for m in args.model] or list(default_models().values())
    print("| model | parameters | vocabulary | head | dtype | device | ms / 1 token | ms / 4 tokens |")
    print("|---|---|---|---|---|---|---|---|")
    for spec in specs:
        model, tok = load_spec(spec)
        params = sum(p.numel() for p in model.parameters())
        head = f"{len(model.kept)} ids" if getattr(model, "restricted_vocab", False) else "full"
        one, four = forward_costs(model, engine_of(model)[0], [1, 4], context=128, repeats=5).values()
        dtype = next(model.parameters()).dtype
        print(
            f"| {spec.name} | {params / 1e6:.1f}M | {len(tok)} | {head} | {str(dtype).removeprefix('torch.')} "
            f"| {next(model.parameters()).device} | {one:.1f} | {four:.1f} |",
            flush=True,
        )
    return 0


@command(
    "distill",
    "distil a draft from a teacher (cached)",
    arg("--teacher", help="a model name (default: the bundled model)"),
    arg("--layers", type=int, default=2),
    arg("--head-tokens", type=int, help="restrict the head to this many ids (0: full; default 4096)"),
    arg("--steps", type=int, help="training steps (default: the recipe's, 400 for a draft, 300 for a student)"),
    arg(
        "--prompts",
        type=int,
        help="standard-library prompts the teacher continues (default 64 for a draft, 48 for a student)",
    ),
    arg(
        "--max-train-seconds",
        type=float,
        help="a bound on training time (default 150 s for a draft, 100 s for a student)",
    ),
    arg("--seed", type=int, default=0),
    arg("--vocab", type=int, help="a student with a byte-level BPE tokenizer of its own, of this many tokens"),
    arg("--out", type=Path, help="output directory (default: under $SPECENS_CACHE/drafts)"),
    arg("--force", action="store_true", help="distil again even if cached"),
    arg("--threads", type=int, help="CPU threads for torch"),
)
def cmd_distill(args: argparse.Namespace) -> int:
    from .models import BUNDLED, Recipe, ensure_draft, read_meta
    from .models.student import recipe_from

    given = {
        k: v for k, v in named_options(args, "layers steps seed prompts max_train_seconds").items() if v is not None
    }
    if args.vocab is not None:  # a student: its recipe's defaults, the options given on the line
        out = ensure_draft(
            args.teacher or BUNDLED,
            recipe_from({**given, "tokenizer": {"vocab": args.vocab}}, "student"),
            force=args.force,
            out_dir=args.out,
        )
        meta = read_meta(out)
        print(f"student: {out}")
        print(
            f"agreement with {meta['teacher']} in string terms on held-out HumanEval continuations: "
            f"{meta['agreement']:.1%} equal pieces, {meta['agreement_prefix']:.1%} prefix-consistent "
            f"({meta['eval_positions']} positions); vocabulary {meta['vocab']}, {meta['steps']} steps, "
            f"{meta['total_seconds']:.0f} s"
        )
        return 0
    recipe = Recipe(**given, **({} if args.head_tokens is None else {"head_tokens": args.head_tokens}))
    out = ensure_draft(args.teacher or BUNDLED, recipe, force=args.force, out_dir=args.out)
    meta = read_meta(out)
    print(f"draft: {out}")
    print(
        f"greedy agreement with {meta['teacher']} on held-out HumanEval continuations: "
        f"{meta['agreement']:.1%} alone, {meta['agreement_with_lookup']:.1%} with prompt lookup "
        f"({meta['eval_tokens']} tokens); {meta['steps']} steps, {meta['total_seconds']:.0f} s"
    )
    return 0


@command(
    "prepare",
    "make a model ready (convert, download or distil) and record where it is",
    arg("spec", help="the model as inline JSON: {name, source, dtype, device, distill, full_head}"),
    arg("out", type=Path, help="the JSON record written when the model is ready"),
    arg("--threads", type=int, help="CPU threads for torch"),
)
def cmd_prepare(args: argparse.Namespace) -> int:
    from .files import write_atomic
    from .models import ModelError, ModelSpec, load_spec, resolve

    try:
        data = json.loads(args.spec)
        spec = ModelSpec(**data)
    except (json.JSONDecodeError, TypeError) as err:
        raise ModelError(f"model spec {args.spec[:80]}: {err}") from None
    start = time.perf_counter()
    path = resolve(spec)
    model, tokenizer = load_spec(spec)  # loads: the record is only written for a model that works
    record = {
        "name": spec.name,
        "spec": data,
        "path": str(path),
        "parameters": sum(p.numel() for p in model.parameters()),
        "vocabulary": len(tokenizer),
        "seconds": round(time.perf_counter() - start, 1),
    }
    write_atomic(args.out, json.dumps(record, indent=2) + "\n")
    print(json.dumps(record, indent=2))
    return 0
