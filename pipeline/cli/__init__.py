"""The ``pipeline`` command: what the workflow's rules call, and users by hand. Its subcommands, in the order
``pipeline --help`` lists them: those that set an experiment up (``setup.py``: models, a config's checks, the
tools outside the workflow's jobs), then a cell's jobs and a results directory's (``jobs.py``)."""

from __future__ import annotations

from . import jobs, setup
from .commands import build, run

SUBCOMMANDS = (
    setup.cmd_models,
    setup.cmd_distill,
    setup.cmd_prepare,
    setup.cmd_grid,
    setup.cmd_preflight,
    setup.cmd_estimate,
    setup.cmd_lm_eval,
    setup.cmd_bench,
    jobs.cmd_generate,
    jobs.cmd_derive,
    jobs.cmd_speed,
    jobs.cmd_wandb_log,
    jobs.cmd_wandb_log_experiment,
    jobs.cmd_status,
    jobs.cmd_rerun,
    jobs.cmd_likelihood,
    jobs.cmd_aggregate,
    jobs.cmd_notebook,
    jobs.cmd_score,
)
PARSER = build(SUBCOMMANDS)


def main(argv: list[str] | None = None) -> int:
    return run(PARSER, SUBCOMMANDS, argv)
