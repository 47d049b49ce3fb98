"""The ``pipeline`` command: what the workflow's rules call, and users by hand.

pipeline models [--model NAME[=SOURCE] ...]     list models: size, vocabulary, dtype, device, speed
pipeline distill [--layers 2] [--head-tokens 4096] ...   distil a draft from a teacher (cached)
pipeline bench [...]                               the benchmark (python -m pipeline.bench)
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from tasks import TaskError

from .errors import UserError
from .models import BUNDLED, ModelError, ModelSpec, cache_dir, load_spec

DEFAULT_DRAFTS = {  # the partners of the embedded default: small students of the bundled model
    "smollm2-draft-l1": {"teacher": BUNDLED, "layers": 1},
    "smollm2-draft-l2": {"teacher": BUNDLED, "layers": 2},
}


def parse_model(text: str) -> ModelSpec:
    name, _, source = text.partition("=")
    if name in DEFAULT_DRAFTS and not source:
        return ModelSpec(name, distill=dict(DEFAULT_DRAFTS[name]))
    return ModelSpec(name, source or None)


@torch.inference_mode()
def ms_per_forward(model, new_tokens: int, context: int = 128, reps: int = 5) -> float:
    """Median milliseconds of one forward of ``new_tokens`` tokens after ``context`` cached ones."""
    from transformers import DynamicCache

    device = next(model.parameters()).device
    cache = DynamicCache()
    model(input_ids=torch.arange(100, 100 + context, device=device)[None], past_key_values=cache, use_cache=True)
    times = []
    for _ in range(reps + 1):
        ids = torch.full((1, new_tokens), 200, device=device)
        start = time.perf_counter()
        model(input_ids=ids, past_key_values=cache, use_cache=True)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - start)
        cache.crop(-new_tokens)
    return 1000 * sorted(times[1:])[len(times[1:]) // 2]


def cmd_models(args: argparse.Namespace) -> int:
    specs = [parse_model(m) for m in args.model] or [ModelSpec(BUNDLED)] + [
        ModelSpec(n, distill=dict(d)) for n, d in DEFAULT_DRAFTS.items()
    ]
    print("| model | parameters | vocabulary | head | dtype | device | ms / 1 token | ms / 4 tokens |")
    print("|---|---|---|---|---|---|---|---|")
    for spec in specs:
        model, tok = load_spec(spec)
        params = sum(p.numel() for p in model.parameters())
        head = f"{len(model.kept)} ids" if getattr(model, "restricted_vocab", False) else "full"
        one, four = ms_per_forward(model, 1), ms_per_forward(model, 4)
        dtype = next(model.parameters()).dtype
        print(
            f"| {spec.name} | {params / 1e6:.1f}M | {len(tok)} | {head} | {str(dtype).removeprefix('torch.')} "
            f"| {next(model.parameters()).device} | {one:.1f} | {four:.1f} |",
            flush=True,
        )
    return 0


def cmd_distill(args: argparse.Namespace) -> int:
    from .distill import Recipe, ensure_draft, read_meta

    recipe = Recipe(
        layers=args.layers,
        head_tokens=args.head_tokens,
        steps=args.steps,
        seed=args.seed,
        prompts=args.prompts,
        max_train_seconds=args.max_train_seconds,
    )
    out = ensure_draft(args.teacher, recipe, force=args.force, out_dir=args.out)
    meta = read_meta(out)
    print(f"draft: {out}")
    print(
        f"greedy agreement with {meta['teacher']} on held-out HumanEval continuations: "
        f"{meta['agreement']:.1%} alone, {meta['agreement_with_lookup']:.1%} with prompt lookup "
        f"({meta['eval_tokens']} tokens); {meta['steps']} steps, {meta['total_seconds']:.0f} s"
    )
    return 0


def cmd_prepare(args: argparse.Namespace) -> int:
    from .files import write_atomic
    from .models import resolve

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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="pipeline", description="Fast LLM ensembles through speculation")
    sub = ap.add_subparsers(dest="command", required=True)
    m = sub.add_parser("models", help="list models: parameters, vocabulary, dtype, device, ms per forward")
    m.add_argument(
        "--model",
        action="append",
        default=[],
        metavar="NAME[=SOURCE]",
        help=f"a model (repeatable); default: {BUNDLED} and its default drafts",
    )
    d = sub.add_parser("distill", help="distil a draft from a teacher (cached)")
    d.add_argument("--teacher", default=BUNDLED)
    d.add_argument("--layers", type=int, default=2)
    d.add_argument("--head-tokens", type=int, default=4096, help="restrict the head to this many ids (0: full)")
    d.add_argument("--steps", type=int, default=400)
    d.add_argument("--prompts", type=int, default=64)
    d.add_argument("--max-train-seconds", type=float, default=150.0)
    d.add_argument("--seed", type=int, default=0)
    d.add_argument("--out", type=Path, help=f"output directory (default: under {cache_dir() / 'drafts'})")
    d.add_argument("--force", action="store_true", help="distil again even if cached")
    g = sub.add_parser("generate", help="one grid cell's generation job (resumable JSONL)")
    g.add_argument("cell", help="the cell as a JSON file or inline JSON: models, method, task, gamma, size, ...")
    g.add_argument("out", type=Path, help="the JSONL file of samples")
    g.add_argument(
        "--journal-dir",
        type=Path,
        help="append samples to a journal here and move it to OUT when the cell is complete (resumable)",
    )
    g.add_argument("--threads", type=int, help="CPU threads for torch")
    g.add_argument("--timing", help="how samples are timed and judged, as JSON (the config's timing section)")
    g.add_argument("--no-speed", action="store_true", help="leave OUT.speed.json to 'pipeline speed'")
    sp = sub.add_parser("speed", help="judge a finished cell: speed-up, interval, τ, flags, exactness (.speed.json)")
    sp.add_argument("cell", help="the cell as a JSON file or inline JSON (as for generate)")
    sp.add_argument("samples", type=Path, help="the cell's finished JSONL file")
    sp.add_argument("--timing", help="how samples are judged, as JSON (the config's timing section)")
    p = sub.add_parser("prepare", help="make a model ready (convert, download or distil) and record where it is")
    p.add_argument("spec", help="the model as inline JSON: {name, source, dtype, device, distill, full_head}")
    p.add_argument("out", type=Path, help="the JSON record written when the model is ready")
    p.add_argument("--threads", type=int, help="CPU threads for torch")
    w = sub.add_parser("wandb-log", help="log one scored cell to Weights & Biases (never fails the job)")
    w.add_argument("samples", type=Path)
    w.add_argument("status", type=Path, help="where the outcome (run id, mode or the error) is written")
    w.add_argument("--dims", required=True, help="the cell's dimensions as JSON")
    w.add_argument("--cell", default="{}", help="the cell's settings as JSON")
    w.add_argument("--experiment", default="default")
    w.add_argument("--project", default="specens")
    w.add_argument("--entity")
    w.add_argument("--mode", default="auto", choices=["auto", "online", "offline", "disabled"])
    w.add_argument("--dir", type=Path, default=Path("results"), help="where W&B keeps its run files")
    w.add_argument("--init-timeout", type=float, default=15.0, help="seconds to wait for the W&B server")
    a = sub.add_parser("aggregate", help="speed-up and quality tables and plots from a results directory")
    a.add_argument("results", type=Path)
    nb = sub.add_parser("notebook", help="execute the analysis notebook on a results directory")
    nb.add_argument("notebook", type=Path)
    nb.add_argument("out", type=Path)
    nb.add_argument("--results", type=Path, default=Path("results"))
    gr = sub.add_parser("grid", help="check a workflow config and list its cells")
    gr.add_argument("config", type=Path)
    s = sub.add_parser("score", help="score a generations file (JSONL with id and output)")
    s.add_argument("file", type=Path)
    s.add_argument("--task", required=True)
    s.add_argument("--data-dir", help="local benchmark data (laid out like shared/data)")
    s.add_argument("--workers", type=int, default=2, help="samples executed at once (sandboxed processes)")
    le = sub.add_parser("lm-eval", help="lm-eval's command line with the 'specens' model registered", add_help=False)
    le.add_argument("rest", nargs=argparse.REMAINDER)
    b = sub.add_parser("bench", help="the benchmark; see python -m pipeline.bench --help", add_help=False)
    b.add_argument("rest", nargs=argparse.REMAINDER)
    argv = sys.argv[1:] if argv is None else argv
    try:
        if argv and argv[0] == "bench":  # its arguments go through untouched
            from . import bench

            return bench.main(argv[1:])
        if argv and argv[0] == "lm-eval":  # lm-eval's own command line, untouched
            from .lm_eval_model import main as lm_eval_main

            return lm_eval_main(argv[1:])
        args = ap.parse_args(argv)
        if args.command == "models":
            return cmd_models(args)
        if args.command == "distill":
            return cmd_distill(args)
        if getattr(args, "threads", None):
            torch.set_num_threads(args.threads)
        if args.command in ("generate", "speed"):
            from .generate_job import cell_from_dict, cell_key, run_cell, write_speed

            try:
                text = args.cell if args.cell.lstrip().startswith("{") else Path(args.cell).read_text()
                data = json.loads(text)
                if args.timing:
                    data["timing"] = json.loads(args.timing)
                cell = cell_from_dict(data)
            except (OSError, json.JSONDecodeError, UserError, TypeError) as err:
                raise UserError(f"cell {args.cell[:80]}: {err}") from None
            if args.command == "speed":
                if not args.samples.is_file():
                    raise UserError(f"samples file {args.samples} not found")
                print(json.dumps(write_speed(cell, args.samples), indent=2))
                return 0
            journal = None
            if args.journal_dir:
                journal = args.journal_dir / f"{args.out.name.removesuffix('.jsonl')}-{cell_key(cell)}.jsonl"
            summary = run_cell(cell, args.out, journal=journal, speed=not args.no_speed)
            print(json.dumps(summary, indent=2) if summary else f"generated {args.out}")
            return 0
        if args.command == "prepare":
            return cmd_prepare(args)
        if args.command == "wandb-log":
            from .tracking import WandbFailed, log_cell

            try:
                log_cell(
                    args.samples,
                    args.status,
                    dims=json.loads(args.dims),
                    cell=json.loads(args.cell),
                    experiment=args.experiment,
                    project=args.project,
                    entity=args.entity,
                    mode=args.mode,
                    wandb_dir=args.dir,
                    init_timeout=args.init_timeout,
                )
            except WandbFailed as err:
                print(f"error: {err}", file=sys.stderr)
                return 1
            return 0
        if args.command == "aggregate":
            from .aggregate import aggregate

            written = aggregate(args.results)
            print("\n".join(str(p) for p in written))
            return 0
        if args.command == "notebook":
            from .notebook import execute

            execute(args.notebook, args.out, args.results)
            print(f"executed {args.notebook} -> {args.out}")
            return 0
        if args.command == "score":
            from .scoring import score_file

            summary = score_file(args.file, args.task, args.data_dir, workers=args.workers)
            print(json.dumps(summary, indent=2))
            return 0
        from .workflow import main as grid_main  # the last command: grid

        return grid_main([str(args.config)])
    except (UserError, TaskError) as err:  # a user's mistake: one line, no traceback (a bug keeps its traceback)
        print(f"error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
