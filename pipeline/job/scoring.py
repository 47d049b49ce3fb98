"""Score a generations file: its own step, so it can run on a CPU node after generation on a GPU node.

A generations file is JSONL, one sample per line, with at least ``id`` (the
task's example id) and ``output`` (the generated text). Scores go to
``<file>.scores.jsonl`` (one line per sample) and a summary to
``<file>.summary.json``, both written atomically.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from tasks import TaskError, get_task

from ..experiment.paths import beside
from ..files import JSONError, parse_json, read_user_text, write_atomic
from ..measure.intervals import interval, per_example
from ..records import schema_problems

GENERATION_ROW = {  # what the scorer reads of a generations file's line
    "type": "object",
    "required": ["id", "output"],
    "properties": {"id": {"type": "string", "minLength": 1}, "output": {"type": "string"}},
}


def read_generations(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        raise TaskError(f"generations file {path} not found")
    rows = []
    for n, line in enumerate(read_user_text(path, "generations file", links=False).split("\n"), 1):
        if not line.strip():
            continue
        try:
            row = parse_json(line, f"{path}:{n}")
        except JSONError as err:
            raise TaskError(f"{path}:{n} is not valid JSON ({err.msg})") from None
        if problems := schema_problems(GENERATION_ROW, row, f"{path}:{n}"):
            raise TaskError(problems[0])
        rows.append(row)
    return rows


def intervals(scores: list[dict[str, float]], ids: list[str]) -> dict[str, float]:
    """``<metric>_low`` and ``<metric>_high`` for each per-sample metric: the interval of its mean over
    examples (``pipeline.measure.intervals``; an example's samples averaged first)."""
    out = {}
    for metric in sorted({k for s in scores for k, v in s.items() if isinstance(v, int | float)}):
        low, high, _ = interval(per_example(ids, [s.get(metric) for s in scores]))
        if low is not None:
            out[f"{metric}_low"], out[f"{metric}_high"] = low, high
    return out


def score_file(path: Path, task_name: str, data_dir: str | Path | None = None, workers: int = 2) -> dict[str, Any]:
    """Score every sample of a generations file; returns the summary."""
    path = Path(path)
    rows = read_generations(path)
    task = get_task(task_name)
    examples = {e.id: e for e in task.load("full", data_dir)}
    if missing := sorted({r["id"] for r in rows} - set(examples)):
        raise TaskError(f"{len(missing)} ids of {path.name} are not in task {task_name!r} (first: {missing[0]!r})")
    with ThreadPoolExecutor(max_workers=workers) as pool:
        scores = list(pool.map(lambda r: task.score(examples[r["id"]], r["output"]), rows))
    lines = "".join(json.dumps({"id": r["id"], **s}) + "\n" for r, s in zip(rows, scores))
    write_atomic(beside(path, "scores"), lines)
    ids = [r["id"] for r in rows]
    summary = {"task": task_name, "samples": len(rows), **task.aggregate(scores, ids), **intervals(scores, ids)}
    write_atomic(beside(path, "summary"), json.dumps(summary, indent=2) + "\n")
    return summary
