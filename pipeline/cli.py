"""The ``pipeline`` command: what the workflow's rules call, and users by hand.

Each subcommand is a function registered with ``@command`` (``commands.py``; ``pipeline --help`` lists them all,
in the order registered): about models in ``model_commands.py``, a cell's jobs and a results directory's here, a
config's checks in ``config_commands.py``, the rest in ``tool_commands.py``.
A cell file is what the workflow writes to ``results/cells/<cell>.json``: ``{"cell": {...}, "dims": {...}}``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from . import model_commands  # noqa: F401 (registers models, distill, prepare: listed first)
from .commands import COMMANDS, arg, command, named_options, parser
from .errors import UserError


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
    arg("--threads", type=int, help="CPU threads for torch"),
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
    arg("--threads", type=int, help="CPU threads for torch"),
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
    from .tracking import WandbFailed, log_cell

    entry = CellFile.read(args.cell_file)
    try:
        settings = named_options(args, "experiment project entity mode init_timeout")
        log_cell(args.samples, args.status, entry, wandb_dir=args.dir, **settings)
    except WandbFailed as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    return 0


@command(
    "wandb-log-experiment",
    "log an experiment's aggregate tables as its own W&B run",
    arg("results", type=Path, help="the results directory (its tables/)"),
    arg("status", type=Path, help="where the outcome (run id, mode or the error) is written"),
    *WANDB_ARGS,
)
def cmd_wandb_log_experiment(args: argparse.Namespace) -> int:
    from .tracking import WandbFailed, log_experiment

    try:
        log_experiment(args.results, args.status, **named_options(args, "experiment project entity mode init_timeout"))
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
    arg("--threads", type=int, help="CPU threads for torch"),
)
def cmd_likelihood(args: argparse.Namespace) -> int:
    from .likelihood import run

    try:
        spec = json.loads(args.spec)
    except json.JSONDecodeError as err:
        raise UserError(f"likelihood spec {args.spec[:80]!r}: not JSON ({err})") from None
    result = run(spec, args.out, args.threads)
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
    from .notebook import execute

    execute(args.notebook, args.out, args.results)
    print(f"executed {args.notebook} -> {args.out}")
    return 0


# registered after the commands above, so that `pipeline --help` keeps the order of a run
from . import config_commands, tool_commands  # noqa: E402, F401


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        if argv and argv[0] in COMMANDS and COMMANDS[argv[0]].passthrough:
            return COMMANDS[argv[0]].run(argv[1:])
        args = parser().parse_args(argv)
        if getattr(args, "threads", None):
            import torch

            torch.set_num_threads(args.threads)
        return COMMANDS[args.command].run(args)
    except UserError as err:  # a user's mistake: one line, no traceback (a bug keeps its traceback)
        print(f"error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
