"""A results directory's layout, written once: where a cell's files lie and what each of its steps writes beside
its samples (docs/workflow.md, "Read the results"). The Snakemake rules (workflow/rules/*.smk) and every module
that reads or writes a cell's files take their names from here."""

from __future__ import annotations

from pathlib import Path

GENERATIONS = "generations"  # under the results directory: every cell's files, ``<cell id><suffix>``
FAILED = ".failed.json"  # beside a W&B outcome (``.wandb.json``, the experiment's ``wandb.json``): a failed logging
# what a cell's steps write beside its samples, in the order they run (the rule in brackets)
CELL_FILES = {
    "samples": ".jsonl",  # the samples, one JSON line each (generate)
    "meta": ".meta.json",  # the job's versions and settings (generate)
    "speed": ".speed.json",  # the speed judgement (speed)
    "scores": ".scores.jsonl",  # each sample's scores (score)
    "summary": ".summary.json",  # the quality summary (score)
    "wandb": ".wandb.json",  # the W&B outcome (wandb_log)
    "wandb_failed": ".wandb" + FAILED,  # a failed W&B logging, kept for the retry (wandb_log)
}


def cell_path(results: str | Path, cell: str, kind: str = "samples") -> Path:
    """The file ``kind`` of cell ``cell`` in the results directory ``results``."""
    return Path(results) / GENERATIONS / f"{cell}{CELL_FILES[kind]}"


def beside(samples: str | Path, kind: str) -> Path:
    """The file ``kind`` of the cell whose samples are the file ``samples`` (wherever it lies)."""
    return Path(samples).with_suffix(CELL_FILES[kind])
