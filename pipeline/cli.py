"""The ``pipeline`` command: what the workflow's rules call, and users by hand.

Each subcommand is a function registered with ``@command``; ``pipeline --help`` lists them in the order registered:
about models, a cell's jobs (a cell file: ``cell.CellFile``), a results directory's, a config's checks (its cells,
its models, its cost), then the tools outside the workflow's jobs.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .errors import UserError

PARSER = argparse.ArgumentParser(prog="pipeline", description="Fast LLM ensembles through speculation")
SUBCOMMANDS = PARSER.add_subparsers(dest="command", required=True)
COMMANDS: dict[str, tuple[Callable, bool]] = {}  # name -> (run, passthrough: it takes its own command line, untouched)


def arg(*flags, **options) -> tuple[tuple, dict]:
    return flags, options


def named_options(args: argparse.Namespace, names: str) -> dict:
    """The named options of a command line (names separated by spaces), by name."""
    return {name: getattr(args, name) for name in names.split()}


def command(name: str, help: str, *arguments: tuple[tuple, dict], passthrough: bool = False):
    """Register the decorated function as subcommand ``name`` with its arguments: ``run(args) -> exit code``, a
    passthrough command's ``run(argv) -> exit code``."""
    sub = SUBCOMMANDS.add_parser(name, help=help, add_help=not passthrough)
    for flags, options in arguments or [(("rest",), {"nargs": argparse.REMAINDER})]:
        sub.add_argument(*flags, **options)

    def register(run: Callable) -> Callable:
        COMMANDS[name] = run, passthrough
        return run

    return register


def inline_json(text: str, what: str) -> Any:
    """An argument given as inline JSON; one line naming it (``what`` it is) when it is not JSON."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise UserError(f"{what} {text[:80]!r}: not JSON ({err})") from None


THREADS = arg("--threads", type=int, help="CPU threads for torch")


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
    THREADS,
)
def cmd_distill(args: argparse.Namespace) -> int:
    from .models import BUNDLED, Recipe, ensure_draft, read_meta
    from .models.student import recipe_from

    given = {
        k: v for k, v in named_options(args, "layers steps seed prompts max_train_seconds").items() if v is not None
    }
    student = args.vocab is not None  # a student: its recipe's defaults, the options given on the line
    if student:
        recipe = recipe_from({**given, "tokenizer": {"vocab": args.vocab}}, "student")
    else:
        recipe = Recipe(**given, **({} if args.head_tokens is None else {"head_tokens": args.head_tokens}))
    out = ensure_draft(args.teacher or BUNDLED, recipe, force=args.force, out_dir=args.out)
    meta = read_meta(out)
    print(f"{'student' if student else 'draft'}: {out}")
    if student:
        print(
            f"agreement with {meta['teacher']} in string terms on held-out HumanEval continuations: "
            f"{meta['agreement']:.1%} equal pieces, {meta['agreement_prefix']:.1%} prefix-consistent "
            f"({meta['eval_positions']} positions); vocabulary {meta['vocab']}, {meta['steps']} steps, "
            f"{meta['total_seconds']:.0f} s"
        )
    else:
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
    THREADS,
)
def cmd_prepare(args: argparse.Namespace) -> int:
    from .files import write_atomic
    from .models import ModelError, ModelSpec, load_spec, resolve

    data = inline_json(args.spec, "model spec")
    try:
        spec = ModelSpec(**data)
    except TypeError as err:
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


@command(
    "generate",
    "one grid cell's generation job (resumable JSONL)",
    arg("cell_file", help="the cell file (results/cells/<cell>.json): models, method, task, gamma, ..."),
    arg("out", type=Path, help="the JSONL file of samples"),
    arg(
        "--journal-dir",
        type=Path,
        help="append samples to a journal here and move it to OUT when the cell is complete (resumable)",
    ),
    THREADS,
    arg("--timing-file", help="how samples are timed and judged: a JSON file (the config's timing section)"),
    arg("--no-speed", action="store_true", help="leave OUT.speed.json to 'pipeline speed'"),
)
def cmd_generate(args: argparse.Namespace) -> int:
    from .cell import CellFile
    from .generate_job import cell_key, run_cell

    cell = CellFile.read(args.cell_file, args.timing_file).cell
    journal = None
    if args.journal_dir:
        journal = args.journal_dir / f"{args.out.name.removesuffix('.jsonl')}-{cell_key(cell)}.jsonl"
    summary = run_cell(cell, args.out, journal=journal, speed=not args.no_speed)
    print(json.dumps(summary, indent=2) if summary else f"generated {args.out}")
    return 0


@command(
    "speed",
    "judge a finished cell: speed-up, interval, τ, flags, exactness",
    arg("cell_file", help="the cell file (as for generate)"),
    arg("samples", type=Path, help="the cell's finished JSONL file"),
    arg("--timing-file", help="how samples are judged: a JSON file (the config's timing section)"),
    THREADS,
)
def cmd_speed(args: argparse.Namespace) -> int:
    from .cell import CellFile
    from .judge import write_speed

    cell = CellFile.read(args.cell_file, args.timing_file).cell
    if not args.samples.is_file():
        raise UserError(f"samples file {args.samples} not found")
    print(json.dumps(write_speed(cell, args.samples), indent=2))
    return 0


WANDB_ARGS = (  # the W&B run's settings, shared by the per-cell and the per-experiment runs
    arg("--experiment", default="default"),
    arg("--project", default="specens"),
    arg("--entity"),
    arg("--mode", default="auto", choices=["auto", "online", "offline", "disabled"]),
    arg("--init-timeout", type=float, default=15.0, help="seconds to wait for the W&B server"),
)


@command(
    "wandb-log",
    "log one scored cell to Weights & Biases",
    arg("samples", type=Path),
    arg("status", type=Path, help="where the outcome (run id, mode or the error) is written"),
    arg("--cell-file", required=True, help="the cell file: its dims become the run's config"),
    *WANDB_ARGS,
    arg("--dir", type=Path, default=Path("results"), help="where W&B keeps its run files"),
)
def cmd_wandb_log(args: argparse.Namespace) -> int:
    from .cell import CellFile
    from .tracking import log_cell

    entry = CellFile.read(args.cell_file)
    return wandb_logged(log_cell, args, args.samples, args.status, entry, wandb_dir=args.dir)


@command(
    "wandb-log-experiment",
    "log an experiment's aggregate tables as its own W&B run",
    arg("results", type=Path, help="the results directory (its tables/)"),
    arg("status", type=Path, help="where the outcome (run id, mode or the error) is written"),
    *WANDB_ARGS,
)
def cmd_wandb_log_experiment(args: argparse.Namespace) -> int:
    from .tracking import log_experiment

    return wandb_logged(log_experiment, args, args.results, args.status)


def wandb_logged(log: Callable, args: argparse.Namespace, *where, **options) -> int:
    """``log`` (a cell's or the experiment's W&B run) with the command line's W&B settings; 1 when it failed."""
    from .tracking import WandbFailed

    try:
        log(*where, **options, **named_options(args, "experiment project entity mode init_timeout"))
    except WandbFailed as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    return 0


@command("status", "a results directory's cells: done, running, failed (with why), unstable", arg("results", type=Path))
def cmd_status(args: argparse.Namespace) -> int:
    from .status import report

    print(report(args.results))
    return 0


@command(
    "rerun",
    "set cells aside so that the next workflow run measures them again (nothing is deleted)",
    arg("results", type=Path),
    arg("--unstable", action="store_true", required=True, help="the cells the speed judge flagged"),
)
def cmd_rerun(args: argparse.Namespace) -> int:
    from .status import rerun_unstable

    moved = rerun_unstable(args.results)
    print("\n".join(moved) if moved else "no flagged cells")
    return 0


@command(
    "likelihood",
    "score an lm-eval multiple-choice task by log-likelihood under each distribution of a grid",
    arg("spec", help="the job's JSON (pipeline.likelihood.job_specs): task, limit, distributions, models"),
    arg("out", type=Path, help="the JSON file written: each distribution's metrics, intervals, per-question values"),
    THREADS,
)
def cmd_likelihood(args: argparse.Namespace) -> int:
    from .likelihood import run

    result = run(inline_json(args.spec, "likelihood spec"), args.out, args.threads)
    for key, score in result["scores"].items():
        print(key, {m: round(f["value"], 4) for m, f in score["metrics"].items()})
    return 0


@command("aggregate", "speed-up and quality tables and plots from a results directory", arg("results", type=Path))
def cmd_aggregate(args: argparse.Namespace) -> int:
    from .aggregate import aggregate

    print("\n".join(str(p) for p in aggregate(args.results)))
    return 0


@command(
    "notebook",
    "execute the analysis notebook on a results directory",
    arg("notebook", type=Path),
    arg("out", type=Path),
    arg("--results", type=Path, default=Path("results")),
)
def cmd_notebook(args: argparse.Namespace) -> int:
    """Execute the notebook (nbclient) with ``SPECENS_RESULTS`` naming the results directory; write the copy."""
    import nbformat
    from nbclient import NotebookClient

    from .files import write_atomic

    nb = nbformat.read(args.notebook, as_version=4)
    old = os.environ.get("SPECENS_RESULTS")
    os.environ["SPECENS_RESULTS"] = str(args.results.resolve())
    try:
        NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": "."}}).execute()
    finally:
        if old is None:
            os.environ.pop("SPECENS_RESULTS", None)
        else:
            os.environ["SPECENS_RESULTS"] = old
    write_atomic(args.out, nbformat.writes(nb))
    print(f"executed {args.notebook} -> {args.out}")
    return 0


@command("grid", "check a workflow config and list its cells", arg("config", type=Path))
def cmd_grid(args: argparse.Namespace) -> int:
    from .workflow import main as grid_main

    return grid_main([str(args.config)])


@command(
    "preflight",
    "check a config's models and model sets from their files (no weights), every problem at once",
    arg("config", type=Path),
    arg("--gpu", help="the GPU of a generation job (as in 'pipeline estimate'); default: the profile's gpu_model"),
    arg(
        "--profile",
        type=Path,
        default=Path(__file__).parents[1] / "workflow/profiles/slurm/config.yaml",
        help="a Snakemake profile: its generation jobs' gpu_model and mem_mb",
    ),
)
def cmd_preflight(args: argparse.Namespace) -> int:
    """The models table, then every problem (one line each); 1 when any."""
    from .estimate import host_problems, profile_generate, profile_gpu
    from .preflight import table
    from .workflow import load_checked, local_problems

    config, cells = load_checked(args.config)
    profile = args.profile if args.profile and args.profile.exists() else None
    gpu = args.gpu or (profile_gpu(profile) if profile else None)
    infos, problems = local_problems(config, cells, gpu)
    mem_mb = profile_generate(profile).get("mem_mb") if profile else None
    if isinstance(mem_mb, int | float):
        problems += host_problems(cells, infos, mem_mb)
    print("\n".join(table(infos)))
    sets = len({tuple(c.dims.models) for c in cells.values()})
    memory = f"against one {gpu}" if gpu else "not checked (no gpu_model in the profile; give --gpu)"
    print(f"{len(infos)} models, {sets} model sets, {len(cells)} cells; GPU memory {memory}")
    for problem in problems:
        print(f"error: {problem}", file=sys.stderr)
    print(f"{len(problems)} problems" if problems else "no problems found", file=sys.stderr)
    return 1 if problems else 0


@command(
    "estimate",
    "forecast a config's jobs per rule and GPU-hours before it is submitted",
    arg("config", type=Path),
    arg("--gpu", default="a100-80gb", help="a GPU of the table (an unknown one: the closest and --bandwidth)"),
    arg("--bandwidth", type=float, help="memory bandwidth in GB/s, for a GPU not in the table"),
    arg("--acceptance", type=float, help="assumed acceptance of a proposed token (default: printed)"),
    arg("--efficiency", type=float, help="fraction of the bandwidth bound forwards reach (default: printed)"),
    arg("--floor-ms", type=float, help="least time of a forward (default: 2.4 ms on a GPU, 0 on the cpu)"),
    arg("--json", action="store_true", help="machine-readable output"),
)
def cmd_estimate(args: argparse.Namespace) -> int:
    """The forecast as a table, or JSON."""
    from .estimate import ACCEPTANCE, EFFICIENCY, GPU_EFFICIENCY, as_json, forecast, report, settings, settings_line
    from .preflight import inspect_config, models_to_prepare
    from .workflow import load_checked

    name, gpu, floor = settings(args)
    acceptance = ACCEPTANCE if args.acceptance is None else args.acceptance
    efficiency = EFFICIENCY.get(name, GPU_EFFICIENCY) if args.efficiency is None else args.efficiency
    if not 0 <= acceptance < 1 or not 0 < efficiency <= 1:
        raise UserError(f"--acceptance {acceptance} / --efficiency {efficiency}: expected 0 <= a < 1, 0 < e <= 1")
    config, cells = load_checked(args.config)
    dtype = "float32" if name.startswith("cpu") else "bfloat16"
    infos = inspect_config(config, models_to_prepare(config, cells), dtype)
    unknown = [p for i in infos.values() if i.config is None for p in i.problems or [f"{i.name}: {i.where}"]]
    if unknown:  # shapes are all it needs (a missing tokenizer is the preflight's to report)
        raise UserError(f"{unknown[0]} ({len(unknown)} without shapes; 'pipeline preflight {args.config}' lists all)")
    result = forecast(config, cells, infos, gpu, efficiency, floor, acceptance)
    if args.json:
        print(json.dumps(as_json(result, name, gpu, efficiency, floor, acceptance), indent=2))
        return 0
    print(settings_line(name, gpu, efficiency, floor, acceptance))
    print("\n".join(report(result, name)))
    return 0


@command(
    "score",
    "score a generations file (JSONL with id and output)",
    arg("file", type=Path),
    arg("--task", required=True),
    arg("--data-dir", help="local benchmark data (laid out like shared/data)"),
    arg("--workers", type=int, default=2, help="samples executed at once (sandboxed processes)"),
)
def cmd_score(args: argparse.Namespace) -> int:
    from .scoring import score_file

    print(json.dumps(score_file(args.file, args.task, args.data_dir, workers=args.workers), indent=2))
    return 0


@command("lm-eval", "lm-eval's command line: its own models (hf, vllm, ...) and 'specens'", passthrough=True)
def cmd_lm_eval(argv: list[str]) -> int:
    from lm_eval.__main__ import cli_evaluate

    from . import lm_eval_model  # noqa: F401 (registers specens beside the harness's own models)

    sys.argv = ["lm_eval", *argv]
    cli_evaluate()
    return 0


@command("bench", "the benchmark; see python -m pipeline.bench --help", passthrough=True)
def cmd_bench(argv: list[str]) -> int:
    from . import bench

    return bench.main(argv)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        if argv and argv[0] in COMMANDS and COMMANDS[argv[0]][1]:
            return COMMANDS[argv[0]][0](argv[1:])
        args = PARSER.parse_args(argv)
        if getattr(args, "threads", None):
            import torch

            torch.set_num_threads(args.threads)
        return COMMANDS[args.command][0](args)
    except UserError as err:  # a user's mistake: one line, no traceback (a bug keeps its traceback)
        print(f"error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
