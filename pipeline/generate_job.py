"""One grid cell's generation job: a model set, a method, a task, a gamma.

Samples are appended to a JSONL file one by one (flushed and synced), so a
job that dies resumes where it stopped: ids already in the file are skipped.
The job warms up before timing, records the decoder's stats per sample, and
can run the cell's baseline on the same prompt right beside each sample
(alternating which goes first), so the cell's speed-up is a ratio measured
side by side. Hardware and library versions go to ``<out>.meta.json`` and
the cell's speed summary to ``<out>.speed.json`` (both written atomically).
"""

from __future__ import annotations

import hashlib
import json
import platform
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from tasks import get_task, render

from .decoding import generate
from .decoding.methods import accepted_args, check_sampling, check_seed
from .files import read_jsonl, writable_dir, write_atomic
from .journal import Journal
from .models import ModelSpec, load_set


@dataclass
class Cell:
    models: list[ModelSpec]
    method: str
    task: str
    gamma: Any = 1
    method_args: dict[str, Any] = field(default_factory=dict)
    size: str | int = "tiny"
    data_dir: str | None = None
    max_new_tokens: int = 128
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0
    chat: bool = False
    baseline: str | None = None  # a method run beside each sample, e.g. "we" for "we_se"
    baseline_args: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self):  # the decoder's own checks, before anything loads
        for method in (self.method, self.baseline):
            if method is not None:
                accepted_args(method)
        check_sampling(self.temperature, self.top_k, self.top_p, self.max_new_tokens)
        check_seed(self.seed)


def cell_from_dict(data: dict[str, Any]) -> Cell:
    """A cell from its JSON form; ``models`` holds names or ``{name, source, dtype, device, ...}`` objects."""
    data = dict(data)
    models = [ModelSpec(m) if isinstance(m, str) else ModelSpec(**m) for m in data.pop("models", [])]
    if not models:
        raise ValueError("a cell needs at least one model")
    unknown = sorted(set(data) - set(Cell.__dataclass_fields__))
    if unknown:
        raise ValueError(f"unknown cell keys {unknown}; accepted: {', '.join(sorted(Cell.__dataclass_fields__))}")
    return Cell(models=models, **data)


def environment() -> dict[str, Any]:
    import transformers

    info = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_threads": torch.get_num_threads(),
        "cuda": torch.cuda.is_available(),
    }
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
    return info


STATS_KEYS = ("new_tokens", "wall_time_s", "forward_time_s", "rounds", "accepted", "models")


def sample_check(cell: Cell):
    """What a journal line must hold to count as one of this cell's samples."""

    def stats_problem(stats: Any, where: str) -> str | None:
        if not isinstance(stats, dict):
            return f"no '{where}stats' object"
        missing = [k for k in STATS_KEYS if k not in stats]
        return f"'{where}stats' lacks {missing}" if missing else None

    def check(row: dict[str, Any]) -> str | None:
        missing = [k for k in ("output", "token_ids", "stats") if k not in row]
        if missing:
            return f"missing fields {missing}"
        if cell.baseline:
            if not isinstance(row.get("baseline"), dict) or "output" not in row["baseline"]:
                return "no 'baseline' record (this cell runs its baseline beside each sample)"
            return stats_problem(row["stats"], "") or stats_problem(row["baseline"].get("stats"), "baseline.")
        return stats_problem(row["stats"], "")

    return check


def cell_key(cell: Cell) -> str:
    """A short hash of everything that shapes the cell's samples (a journal is only resumed by its own cell)."""
    data = {**cell.__dict__, "models": [m.__dict__ for m in cell.models]}
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()[:12]


def run_cell(cell: Cell, out: Path, progress: bool = True, journal: Path | None = None) -> dict[str, Any]:
    """Generate every missing sample of ``cell`` into ``out``; return the speed summary.

    Samples are appended to ``journal`` (default: ``out`` itself) as they are made; with a separate
    journal, ``out`` appears only once the cell is complete (the journal is renamed to it), so a
    workflow manager that deletes the outputs of a failed job never deletes generated samples.
    """
    from tqdm import tqdm

    out = Path(out)
    journal = Path(journal) if journal else out
    writable_dir(out.parent)
    task = get_task(cell.task)
    examples = task.load(cell.size, cell.data_dir, cell.seed)
    log = Journal(journal, [ex.id for ex in examples], sample_check(cell))
    done = log.recover()  # before the models load: a journal problem costs nothing
    models, tokenizer = load_set(cell.models)
    write_atomic(
        out.with_suffix(".meta.json"),
        json.dumps(
            {
                "environment": environment(),
                "cell": {
                    **{k: v for k, v in cell.__dict__.items() if k != "models"},
                    "models": [m.name for m in cell.models],
                },
            },
            indent=2,
            default=str,
        )
        + "\n",
    )

    def run(method: str, args: dict, prompt_ids: list[int], stops: list[str], seed: int, max_new: int):
        return generate(
            models,
            prompt_ids,
            method,
            gamma=cell.gamma,
            max_new_tokens=max_new,
            temperature=cell.temperature,
            top_k=cell.top_k,
            top_p=cell.top_p,
            method_args=args,
            seed=seed,
            eos_token_id=tokenizer.eos_token_id,
            stop_strings=stops,
            tokenizer=tokenizer,
        )

    rendered = [(ex, *render(task, ex, tokenizer, cell.chat)) for ex in examples]
    first_ids = tokenizer(rendered[0][1]).input_ids
    run(cell.method, cell.method_args, first_ids, [], cell.seed, 8)  # warm-up, not recorded
    if cell.baseline:
        run(cell.baseline, cell.baseline_args, first_ids, [], cell.seed, 8)
    todo = [(i, r) for i, r in enumerate(rendered) if r[0].id not in done]
    if done and progress:
        print(f"resuming {journal}: {len(done)} of {len(rendered)} samples already generated", flush=True)
    with log.writer() as add:
        for i, (ex, prompt, stops) in tqdm(todo, desc=f"{cell.method} {cell.task}", disable=not progress):
            ids = tokenizer(prompt).input_ids
            order = [("method", cell.method, cell.method_args), ("baseline", cell.baseline, cell.baseline_args)]
            order = order if i % 2 == 0 or not cell.baseline else order[::-1]
            row: dict[str, Any] = {"id": ex.id}
            for role, method, args in order:
                if method is None:
                    continue
                result = run(method, args, ids, stops, cell.seed + i, cell.max_new_tokens)
                if role == "method":
                    row.update(output=result.text, token_ids=result.token_ids, stats=result.stats.to_dict())
                else:
                    row["baseline"] = {"output": result.text, "stats": result.stats.to_dict()}
            add(row)
    rows = log.finish(out)  # every sample, each id once, in the task's order
    summary = speed_summary(rows)
    write_atomic(out.with_suffix(".speed.json"), json.dumps(summary, indent=2) + "\n")
    if journal != out:
        journal.unlink()  # last: until here a crash leaves every sample in the journal
    return summary


def speed_summary(rows: list[dict[str, Any]] | Path) -> dict[str, Any]:
    """Tokens per second as total tokens over total time (not a mean of rates), acceptance, side-by-side ratios.

    ``acceptance_rate`` is accepted over verified proposals, every proposer (models and prompt lookup)
    together; ``overhead`` the share of wall time outside model forwards.
    """
    rows = read_jsonl(rows) if isinstance(rows, Path) else rows
    tokens = sum(r["stats"]["new_tokens"] for r in rows)
    wall = sum(r["stats"]["wall_time_s"] for r in rows)
    rounds = sum(r["stats"]["rounds"] for r in rows)
    proposers = [m for r in rows for m in [*r["stats"]["models"], *r["stats"].get("proposers", {}).values()]]
    verified = sum(m["verified"] for m in proposers)
    summary: dict[str, Any] = {
        "samples": len(rows),
        "new_tokens": tokens,
        "wall_time_s": wall,
        "tokens_per_s": tokens / wall if wall else None,
        "mean_accepted_per_round": sum(r["stats"]["accepted"] for r in rows) / rounds if rounds else None,
        "acceptance_rate": sum(m["accepted"] for m in proposers) / verified if verified else None,
        "overhead": 1 - sum(r["stats"]["forward_time_s"] for r in rows) / wall if wall else None,
    }
    if rows and all("baseline" in r for r in rows):
        b_tokens = sum(r["baseline"]["stats"]["new_tokens"] for r in rows)
        b_wall = sum(r["baseline"]["stats"]["wall_time_s"] for r in rows)
        summary["baseline_tokens_per_s"] = b_tokens / b_wall if b_wall else None
        if summary["tokens_per_s"] and summary["baseline_tokens_per_s"]:
            summary["speedup_side_by_side"] = summary["tokens_per_s"] / summary["baseline_tokens_per_s"]
    return summary
