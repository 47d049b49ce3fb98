"""A results directory's paths, written once: where every file of a results directory lies (``Results``: the grid
index, the cell files, the prepared models, the tables and plots, the logs, ...), where a cell's files lie and what
each of its steps writes beside its samples (docs/workflow.md, "Read the results"). The Snakemake rules
(workflow/rules/*.smk: ``PATHS``, with the results root passed to each command as it is, never worked back out of
a path) and every module that reads or writes a results directory take their names from here
(``tests/test_structure.py`` finds a results file named anywhere else)."""

from __future__ import annotations

from dataclasses import dataclass
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


@dataclass(frozen=True)
class Results:
    """The files of the results directory ``root``, by what they hold (the rules pass ``"{cell}"``-style wildcards
    as names: each path is a pattern there)."""

    root: Path

    def __init__(self, root: str | Path):
        object.__setattr__(self, "root", Path(root))

    def root_of(self, path: str | Path, named: Path) -> str:
        """The results root as a job sees it, from ``path``, the job's own path of the file these paths name
        ``named`` (its input or output: on storage without a shared filesystem, Snakemake hands a job paths of
        its own, so a rule takes the root from its files, as Snakemake's linter asks, never from the config)."""
        relative, parts = named.relative_to(self.root).parts, Path(path).parts
        if parts[len(parts) - len(relative) :] != relative:
            raise ValueError(f"{path} is not the file {named} of a results directory")
        return str(Path(*parts[: len(parts) - len(relative)]))

    @property
    def grid(self) -> Path:  # the index of the config's cells: each one's dimensions (rule grid)
        return self.root / "grid.json"

    def cell_file(self, cell: str) -> Path:  # one cell's settings and dimensions, its jobs' only source (rule cell)
        return self.root / "cells" / f"{cell}.json"

    def cell(self, cell: str, kind: str = "samples") -> Path:  # a cell's own files (CELL_FILES)
        return cell_path(self.root, cell, kind)

    @property
    def models(self) -> Path:  # each prepared model's record (rule prepare_model)
        return self.root / "models"

    def model(self, name: str) -> Path:
        return self.models / f"{name}.json"

    def fetched(self, name: str) -> Path:  # a model's files fetched from the hub (rule fetch_model)
        return self.models / f"{name}.fetched"

    @property
    def timing(self) -> Path:  # how samples are timed and judged (rule timing)
        return self.root / "timing.json"

    def journal(self, group: str) -> Path:  # the generation journals of a cell's folder (rule generate)
        return self.root / "journal" / group

    def environment(self, record: str) -> Path:  # an engine's environment's record (its engine's ``environment``)
        return self.root / record

    @property
    def likelihoods(self) -> Path:  # each task's log-likelihood figures (rule likelihood)
        return self.root / "likelihood"

    def likelihood(self, task: str) -> Path:
        return self.likelihoods / f"{task}.json"

    @property
    def tables(self) -> Path:  # the aggregate tables (rule aggregate)
        return self.root / "tables"

    def table(self, name: str, suffix: str) -> Path:
        return self.tables / f"{name}.{suffix}"

    @property
    def summary(self) -> Path:  # every table on one page
        return self.table("summary", "md")

    @property
    def cells_table(self) -> Path:  # every number of every cell
        return self.table("cells", "csv")

    @property
    def default_tables(self) -> tuple[Path, Path]:  # the tables the workflow's default target asks for
        return self.cells_table, self.summary

    def rerun(self, stamp: str) -> Path:  # where ``pipeline rerun`` sets a measurement's files aside
        return self.root / "rerun" / stamp

    @property
    def plots(self) -> Path:
        return self.root / "plots"

    @property
    def results_file(self) -> Path:  # the figures as one record (rule aggregate)
        return self.root / "results.json"

    @property
    def notebook(self) -> Path:  # the analysis notebook, executed (rule notebook)
        return self.root / "analysis.ipynb"

    @property
    def wandb(self) -> Path:  # the experiment's W&B outcome (rule wandb_experiment)
        return self.root / "wandb.json"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    def log(self, step: str, name: str | None = None) -> Path:  # a job's log: logs/<step>.log, logs/<step>/<name>.log
        return self.logs / f"{step}.log" if name is None else self.logs / step / f"{name}.log"
