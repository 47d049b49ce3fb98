"""One machine-readable file per experiment, ``results/<exp>/results.json`` (docs/workflow.md: every cell's speed,
quality and config, and the versions, commit and machine that made them), and the paper beside ours
(``paper_vs_ours``: the speed-ups of ``config/paper_reported.yaml`` beside ours, with whether each lies in our
interval).
"""

from __future__ import annotations

import datetime as dt
import fnmatch
import json
import math
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from .. import ROOT
from ..experiment.paths import Results
from ..measure.speed import SpeedSummary
from ..provenance import git_state, machine, versions
from .control import Control

SPEED_KEYS = SpeedSummary.shown("published")
RATIOS = ("speedup_vs_standard", "speedup_vs_large")  # computed across cells by the aggregate step


def _plain(value: Any) -> Any:
    """JSON-ready: NaN to None, numpy scalars to Python ones, recursively."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if hasattr(value, "item") and not isinstance(value, str):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _read(path: Path) -> dict[str, Any] | None:
    from ..experiment.cell import CELL_FILE
    from ..records import read_record

    return read_record(path, CELL_FILE) if path.exists() else None


def cell_record(results: Path, row: pd.Series, read: dict[str, Any]) -> dict[str, Any]:
    """One cell of ``results.json``: its speed, quality and config (``row``: its row of cells.csv; ``read``: its
    speed record and score summary as the aggregate read them, ``Collected.records``)."""
    speed = read.get("speed") or {}
    record = {k: speed.get(k) for k in SPEED_KEYS}
    for name in RATIOS:
        for suffix in ("", "_low", "_high", "_unstable"):
            record[name + suffix] = row.get(name + suffix)
    quality = {k: v for k, v in (read.get("quality") or {}).items() if k != "samples"}
    cell_file = _read(Results(results).cell_file(row["id"])) or {}
    dims = cell_file.get("dims") or {k: row.get(k) for k in ("dataset", "model_set", "method", "temperature", "gamma")}
    return {"id": row["id"], "dims": dims, "speed": record, "quality": quality, "config": cell_file.get("cell")}


def results_document(
    results: Path, df: pd.DataFrame, records: dict[str, dict[str, Any]], control: Control | None = None
) -> dict[str, Any]:
    """Everything ``results.json`` holds (``df``: the cells' rows, as ``figures.per_cell`` gives them; ``records``:
    each cell's files as the aggregate read them, ``Collected.records``; ``control``: the run's null cell, and
    the line that flags the run when its interval misses 1.00)."""
    experiment = str(df["experiment"].iloc[0]) if "experiment" in df else None
    return _plain(
        {
            "experiment": experiment,
            "created": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "confidence": df.attrs.get("confidence"),
            "control": (control or Control()).to_json(),
            "cells": [cell_record(results, row, records.get(row["id"], {})) for _, row in df.iterrows()],
            "versions": versions(),
            "git": git_state(),
            "machine": machine(),
        }
    )


def write_results_file(
    results: Path, df: pd.DataFrame, records: dict[str, dict[str, Any]], control: Control | None = None
) -> Path:
    from ..files import write_atomic

    path = Results(results).results_file
    document = results_document(results, df, records, control)
    write_atomic(path, json.dumps(document, indent=1, allow_nan=False) + "\n")
    return path


# ---- the paper beside ours --------------------------------------------------------------------------


def load_reported(path: Path = ROOT / "config" / "paper_reported.yaml") -> dict[str, Any]:
    return yaml.safe_load(Path(path).read_text())


def paper_vs_ours(speed: pd.DataFrame, reported: dict[str, Any]) -> pd.DataFrame:
    """Each figure the paper reports beside ours (``speed``: the speed-up table's numbers, one row per model set x
    method x T, columns per dataset). A figure names a method (a glob: ``*_se``), and may name a model set, a T
    and a dataset (absent: every one); it is a single speed-up (``speedup``) or a range (``low``, ``high``).
    ``paper_in_our_interval``: whether the paper's figure lies in our interval; ``ours_in_paper_range``: whether
    our estimate lies in the paper's range. A figure without a number stays empty."""
    rows = []
    table = speed.reset_index()
    datasets = [c.removesuffix("_low") for c in table.columns if c.endswith("_low")]
    for fig in reported.get("figures", []):
        for _, r in table[table["method"].map(lambda m, f=fig: fnmatch.fnmatch(m, f["method"]))].iterrows():
            if fig.get("model_set") not in (None, r["model_set"]) or fig.get("T") not in (None, str(r["T"])):
                continue
            for ds in datasets if fig.get("dataset") is None else [fig["dataset"]]:
                ours, low, high = (r.get(f"{ds}{s}") for s in ("", "_low", "_high"))
                if ours is None or pd.isna(ours):
                    continue
                paper, p_low, p_high = fig.get("speedup"), fig.get("low"), fig.get("high")
                inside = bool(pd.notna(low) and pd.notna(high) and low <= paper <= high) if paper is not None else None
                in_range = bool(p_low <= ours <= p_high) if p_low is not None and p_high is not None else None
                rows.append(
                    {
                        "model_set": r["model_set"],
                        "method": r["method"],
                        "T": r["T"],
                        "dataset": ds,
                        "paper": paper,
                        "paper_low": p_low,
                        "paper_high": p_high,
                        "paper_source": fig.get("source"),
                        "ours": ours,
                        "ours_low": low,
                        "ours_high": high,
                        "paper_in_our_interval": inside,
                        "ours_in_paper_range": in_range,
                    }
                )
    if not rows:
        return pd.DataFrame()
    return pd.DataFrame(rows).set_index(["model_set", "method", "T", "dataset"])
