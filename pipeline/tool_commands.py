"""The ``pipeline`` subcommands outside the workflow's jobs: score a generations file, lm-eval's own command
line, the benchmark."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from .commands import arg, command


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
    from .lm_eval_model import main as lm_eval_main

    return lm_eval_main(argv)


@command("bench", "the benchmark; see python -m pipeline.bench --help", passthrough=True)
def cmd_bench(argv: list[str]) -> int:
    from . import bench

    return bench.main(argv)
