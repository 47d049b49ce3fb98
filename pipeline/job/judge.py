"""The speed judge: a finished cell's samples judged into ``<out>.speed.json`` (``speed.summarize``, with the
exactness of a greedy cell against its baseline, ``exactness.py``). A sample holds its prompt's token ids, as the
generation job fed them (``prompt_ids``); the judge reads them there and renders a prompt again only for a file
written before samples held them.

The generation job calls it once its samples are complete; the workflow runs it as its own rule (``pipeline
speed``), so that changing how speed is judged never regenerates a sample.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tasks import get_task, render

from ..experiment.cell import Cell
from ..experiment.paths import beside
from ..files import read_jsonl, write_atomic
from ..measure.speed import summarize


def prompt_ids(cell: Cell, rows: list[dict[str, Any]]) -> dict[str, list[int]]:
    """Each sample's prompt as token ids, as the generation job fed them: read from the samples, rendered again
    only where a sample does not hold them (a file written before samples held them)."""
    if all("prompt_ids" in r for r in rows):
        return {r["id"]: r["prompt_ids"] for r in rows}
    from transformers import AutoTokenizer

    from ..models import resolve

    tokenizer = AutoTokenizer.from_pretrained(resolve(cell.models[0]))
    task = get_task(cell.task)
    examples = task.load(cell.size, cell.data_dir, cell.seed)
    return {ex.id: tokenizer(render(task, ex, tokenizer, cell.chat)[0]).input_ids for ex in examples}


def write_speed(
    cell: Cell, out: Path, rows: list[dict[str, Any]] | None = None, prompts: dict[str, list[int]] | None = None
) -> dict[str, Any]:
    """Judge a finished cell's samples (``speed.summarize``, exactness at T=0) into ``<out>.speed.json``."""
    out = Path(out)
    rows = read_jsonl(out, links=False) if rows is None else rows
    exact = None
    if cell.baseline and cell.temperature == 0:
        from .exactness import check

        mismatched = any(r["token_ids"] != r["baseline"]["token_ids"] for r in rows)
        prompts = prompts if prompts is not None or not mismatched else prompt_ids(cell, rows)
        exact = check(rows, prompts or {}, cell.models, cell.baseline, cell.baseline_args, cell.policy.near_tie_nats)
    summary = summarize(rows, cell.policy, exact).to_json()
    write_atomic(beside(out, "speed"), json.dumps(summary, indent=2) + "\n")
    return summary
