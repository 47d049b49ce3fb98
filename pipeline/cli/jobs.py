"""The ``pipeline`` subcommands the workflow's rules call: a cell's jobs (a cell file: ``experiment.cell.CellFile``)
and a results directory's (listed in ``cli/__init__.py``)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path

from ..errors import UserError
from .commands import THREADS, arg, command, inline_json, named_options


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
    from ..experiment.cell import CellFile
    from ..job.generate import cell_key, run_cell

    cell = CellFile.read(args.cell_file, args.timing_file).cell
    journal = None
    if args.journal_dir:
        journal = args.journal_dir / f"{args.out.name.removesuffix('.jsonl')}-{cell_key(cell)}.jsonl"
    summary = run_cell(cell, args.out, journal=journal, speed=not args.no_speed)
    print(json.dumps(summary, indent=2) if summary else f"generated {args.out}")
    return 0


@command(
    "derive",
    "a standard method's cell from the side-by-side runs of it in another cell (its dims' samples_from)",
    arg("cell_file", help="the standard method's cell file (as for generate)"),
    arg("source", type=Path, help="the finished JSONL file of the cell named by samples_from"),
    arg("out", type=Path, help="the JSONL file of samples"),
)
def cmd_derive(args: argparse.Namespace) -> int:
    from ..job.derive import derive_cell

    if not args.source.is_file():
        raise UserError(f"samples file {args.source} not found")
    print(f"{args.out}: {derive_cell(Path(args.cell_file), args.source, args.out)} samples from {args.source}")
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
    from ..experiment.cell import CellFile
    from ..job.judge import write_speed

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
    from ..experiment.cell import CellFile
    from ..report.tracking import log_cell

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
    from ..report.tracking import log_experiment

    return wandb_logged(log_experiment, args, args.results, args.status)


def wandb_logged(log: Callable, args: argparse.Namespace, *where, **options) -> int:
    """``log`` (a cell's or the experiment's W&B run) with the command line's W&B settings; 1 when it failed."""
    from ..report.tracking import WandbFailed

    try:
        log(*where, **options, **named_options(args, "experiment project entity mode init_timeout"))
    except WandbFailed as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    return 0


@command("status", "a results directory's cells: done, running, failed (with why), unstable", arg("results", type=Path))
def cmd_status(args: argparse.Namespace) -> int:
    from ..report.status import report

    print(report(args.results))
    return 0


@command(
    "rerun",
    "set cells aside so that the next workflow run measures them again (nothing is deleted)",
    arg("results", type=Path),
    arg("--unstable", action="store_true", required=True, help="the cells the speed judge flagged"),
)
def cmd_rerun(args: argparse.Namespace) -> int:
    from ..report.status import rerun_unstable

    moved = rerun_unstable(args.results)
    print("\n".join(moved) if moved else "no flagged cells")
    return 0


@command(
    "likelihood",
    "score an lm-eval multiple-choice task by log-likelihood under each distribution of a grid",
    arg("spec", help="the job's JSON (pipeline.job.likelihood.job_specs): task, limit, distributions, models"),
    arg("out", type=Path, help="the JSON file written: each distribution's metrics, intervals, per-question values"),
    THREADS,
)
def cmd_likelihood(args: argparse.Namespace) -> int:
    from ..job.likelihood import run

    result = run(inline_json(args.spec, "likelihood spec"), args.out, args.threads)
    for key, score in result["scores"].items():
        print(key, {m: round(f["value"], 4) for m, f in score["metrics"].items()})
    return 0


@command("aggregate", "speed-up and quality tables and plots from a results directory", arg("results", type=Path))
def cmd_aggregate(args: argparse.Namespace) -> int:
    from ..report.aggregate import aggregate

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

    from ..files import write_atomic

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


@command(
    "score",
    "score a generations file (JSONL with id and output)",
    arg("file", type=Path),
    arg("--task", required=True),
    arg("--data-dir", help="local benchmark data (laid out like shared/data)"),
    arg("--workers", type=int, default=2, help="samples executed at once (sandboxed processes)"),
)
def cmd_score(args: argparse.Namespace) -> int:
    from ..job.scoring import score_file

    print(json.dumps(score_file(args.file, args.task, args.data_dir, workers=args.workers), indent=2))
    return 0
