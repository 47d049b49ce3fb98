"""One grid cell's generation job: a model set, a method, a task, a gamma (docs/workflow.md, rule ``generate``).

Samples are appended to a journal one by one (``journal.py``), so a job that dies resumes where it stopped. The
job warms up before timing and runs the cell's baseline beside each sample (alternating which goes first), so the
speed-up is a ratio measured side by side; a pair that was interfered with (``timing.py``) is run again, up to
``timing.remeasure`` times, every attempt's timing kept (docs/speed.md, "Interference"). Hardware and library
versions go to ``<out>.meta.json``, the speed judgement to ``<out>.speed.json`` (``judge.py``).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from tasks import get_task, render
from tasks.base import Example, Task

from ..decoding.engines import Runs
from ..decoding.spec import parse_method
from ..engines import behaviour
from ..errors import UserError
from ..experiment.cell import Cell
from ..experiment.paths import beside
from ..files import parse_json, writable_dir, write_atomic
from ..measure.timing import Probe
from ..provenance import environment, run_record
from .journal import Journal, journal_lock
from .judge import write_speed

STATS_KEYS = ("new_tokens", "wall_time_s", "forward_time_s", "rounds", "accepted", "models")


def sample_check(cell: Cell):
    """What a journal line must hold to count as one of this cell's samples."""

    def stats_problem(stats: Any, where: str) -> str | None:
        if not isinstance(stats, dict):
            return f"no '{where}stats' object"
        missing = [k for k in STATS_KEYS if k not in stats]
        return f"'{where}stats' lacks {missing}" if missing else None

    def check(row: dict[str, Any]) -> str | None:
        if missing := [k for k in ("output", "token_ids", "stats") if k not in row]:
            return f"missing fields {missing}"
        if cell.baseline:
            if not isinstance(row.get("baseline"), dict) or not {"output", "token_ids"} <= set(row["baseline"]):
                return "no 'baseline' record (this cell runs its baseline beside each sample)"
            return stats_problem(row["stats"], "") or stats_problem(row["baseline"].get("stats"), "baseline.")
        return stats_problem(row["stats"], "")

    return check


def resumed_check(cell: Cell, vocab: int, text: Callable[[list[int]], str]) -> Callable[[dict[str, Any]], str | None]:
    """What a journal line must be to be resumed as one of this cell's samples, once its runs are ready:
    ``sample_check``'s fields, then token ids of the runs' vocabulary (``0 <= id < vocab``) and an output that is
    their ``text``, as the job writes a sample (the baseline's record likewise)."""
    fields = sample_check(cell)

    def check(row: dict[str, Any]) -> str | None:
        if problem := fields(row):
            return problem
        records = [("", row), *([("baseline.", row["baseline"])] if cell.baseline else [])]
        return next((p for where, record in records if (p := ids_problem(record, where, vocab, text))), None)

    return check


def ids_problem(record: dict[str, Any], where: str, vocab: int, text: Callable[[list[int]], str]) -> str | None:
    """Why ``record``'s ``token_ids`` and ``output`` are not a sample the runs could have made (None: they are)."""
    ids = record.get("token_ids")
    if not isinstance(ids, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
        return f"'{where}token_ids' is not a list of token ids ({type(ids).__name__})"
    if (outside := next((t for t in ids if not 0 <= t < vocab), None)) is not None:
        return f"'{where}token_ids' holds {str(outside)[:40]}, outside the vocabulary (0 to {vocab - 1})"
    if record.get("output") != text(ids):
        return f"'{where}output' is not the text of its token_ids (as this job decodes them)"
    return None


def cell_key(cell: Cell) -> str:
    """A short hash of everything that shapes the cell's samples (a journal is only resumed by its own cell).

    How samples are timed and judged (``timing``) is left out: changing a threshold keeps the samples.
    """
    data = {k: v for k, v in cell.__dict__.items() if k not in ("timing", "policy")}
    data["models"] = [m.__dict__ for m in cell.models]
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()[:12]


def run_cell(
    cell: Cell, out: Path, progress: bool = True, journal: Path | None = None, speed: bool = True
) -> dict[str, Any] | None:
    """Generate every missing sample of ``cell`` into ``out``; return the speed summary.

    Samples are appended to ``journal`` (default: ``out`` itself) as they are made; with a separate journal,
    ``out`` appears only once the cell is complete (written from the journal), so a workflow manager that deletes
    the outputs of a failed job never deletes generated samples. ``speed=False`` leaves the judge to its own rule.
    """
    out = Path(out)
    journal = Path(journal) if journal else out
    writable_dir(out.parent)
    with journal_lock(journal):
        return _run_cell(cell, out, progress, journal, speed)


def _run_cell(cell: Cell, out: Path, progress: bool, journal: Path, speed: bool) -> dict[str, Any] | None:
    """``run_cell``'s work, under the journal's lock."""
    task = get_task(cell.task)
    examples = task.load(cell.size, cell.data_dir, cell.seed)
    if cell.seed + len(examples) > 2**64:
        raise UserError(f"seed={cell.seed}: the samples use seeds up to seed + {len(examples) - 1}, beyond 2**64-1")
    log = Journal(journal, [ex.id for ex in examples], sample_check(cell))
    done = log.recover()  # before the models load: a journal problem costs nothing
    with ExitStack() as stack:
        runs = behaviour(parse_method(cell.method).engine).runs(cell, stack)  # ours, or vLLM's workers (engines/)
        if done:  # each resumed line a sample of these runs: ids of their vocabulary, the output their text
            done = log.refuse(done, resumed_check(cell, runs.vocab, runs.text))
        return _generate(cell, out, progress, journal, speed, task, examples, log, done, runs)


def recycled_rows(row: dict[str, Any], vocab: int) -> dict[int, list[int]] | None:
    """The recycled table a journalled sample left (``Corpus.left_by``, as ``measure`` keeps it), its ids checked
    against the vocabulary; None where the line keeps none (its cell reads no table, or the line is damaged: the
    prompts after it then start from what the others left)."""
    kept = row.get("recycled")
    if not isinstance(kept, dict):
        return None

    def token(x: Any) -> bool:
        return isinstance(x, int) and not isinstance(x, bool) and 0 <= x < vocab

    rows = {}
    for key, ranked in kept.items():
        if not (isinstance(key, str) and key.isdigit() and len(key) <= 12 and token(int(key))):
            return None
        if not isinstance(ranked, list):
            return None
        if not all(token(t) for t in ranked):
            return None
        rows[int(key)] = ranked
    return rows


def _generate(
    cell: Cell,
    out: Path,
    progress: bool,
    journal: Path,
    speed: bool,
    task: Task,
    examples: list[Example],
    log: Journal,
    done: dict[str, bytes],
    runs: Runs,
) -> dict[str, Any] | None:
    """``run_cell``'s samples, once the cell's runs are ready (its engine's ``runs``, ``pipeline/engines/``)."""
    from tqdm import tqdm

    run, tokenizer, corpus = runs.run, runs.tokenizer, runs.corpus  # the corpus: read by its proposers
    meta = {"environment": environment(), "cell": cell.described()}
    if corpus is not None:
        meta["corpus"] = corpus.describe()
    write_atomic(beside(out, "meta"), json.dumps(meta, indent=2, default=str) + "\n")
    trees = {"tree": cell.tree} if cell.tree is not None else {}  # the method's own, never its baseline's

    rendered = [(ex, *render(task, ex, tokenizer, cell.chat)) for ex in examples]
    prompts = {ex.id: tokenizer(prompt).input_ids for ex, prompt, _ in rendered}
    first_ids = prompts[rendered[0][0].id]
    run(
        first_ids, cell.method, method_args=cell.method_args, seed=cell.seed, max_new_tokens=8, **trees
    )  # warm-up, not recorded
    if cell.baseline:
        run(first_ids, cell.baseline, method_args=cell.baseline_args, seed=cell.seed, max_new_tokens=8)
    here = runs.prepare(prompts)
    this_run = run_record()  # which run generated each sample: a resume or a requeue shows in the speed record
    todo = [r for r in rendered if r[0].id not in done]
    if done and progress:
        print(f"resuming {journal}: {len(done)} of {len(rendered)} samples already generated", flush=True)
        timed_on = {json.dumps(parse_json(r, str(journal)).get("provenance"), sort_keys=True) for r in done.values()}
        if timed_on != {json.dumps(here, sort_keys=True)}:
            print(f"warning: {journal} holds samples timed elsewhere; the cell will be flagged", flush=True)

    stuck = 0  # consecutive pairs interfered on every attempt: the interference is persistent

    def measure(i: int, ex, stops: list[str]) -> dict[str, Any]:
        """One sample (and its baseline beside it), re-run while interfered, at most ``remeasure`` more times; run
        once while two pairs or more in a row stayed interfered through every attempt (docs/speed.md)."""
        nonlocal stuck
        own = {**trees, **({"corpus": corpus.view(ex.id)} if corpus is not None else {})}
        order = [("method", cell.method, cell.method_args, own), ("baseline", cell.baseline, cell.baseline_args, {})]
        order = [o for o in (order if i % 2 == 0 else order[::-1]) if o[1] is not None]
        attempts, results = [], []
        for _ in range(cell.policy.remeasure + 1 if stuck < 2 else 1):
            outcome, timing = {}, {}
            for role, method, args, extra in order:
                with Probe(runs.pids()) as probe:  # worker processes: their time is the job's
                    outcome[role] = run(
                        prompts[ex.id], method, method_args=args, seed=cell.seed + i, stop_strings=stops, **extra
                    )
                timing[role] = {**probe.result, "interfered": cell.policy.thresholds.interfered(probe.result)}
            attempts.append({"interfered": any(t["interfered"] for t in timing.values()), **timing})
            results.append(outcome)
            if not attempts[-1]["interfered"]:
                break
        counted = next((k for k, a in enumerate(attempts) if not a["interfered"]), None)
        stuck = 0 if counted is not None else stuck + 1
        if counted is None:  # interfered every time: the least interfered attempt counts, still flagged
            counted = min(range(len(attempts)), key=lambda k: cell.policy.thresholds.worst(attempts[k]))
        method, row = results[counted]["method"], {"id": ex.id, "prompt_ids": prompts[ex.id]}
        if ex.meta.get("category"):
            row["category"] = ex.meta["category"]
        row.update(output=method.text, token_ids=method.token_ids, stats=method.stats.to_dict())
        if getattr(method, "pieces", None) is not None:  # different tokenizers: union ids, and their text
            row["pieces"] = method.pieces
        if "baseline" in results[counted]:
            b = results[counted]["baseline"]
            row["baseline"] = {"output": b.text, "token_ids": b.token_ids, "stats": b.stats.to_dict()}
            if getattr(b, "pieces", None) is not None:  # its own cell's samples may be these (job/derive.py)
                row["baseline"]["pieces"] = b.pieces
        row["timing"] = {"attempts": attempts, "counted": counted}
        row["provenance"], row["run"] = here, this_run
        if corpus is not None and (left := corpus.left_by(ex.id)) is not None:  # what a resume restores
            row["recycled"] = {str(t): ranked for t, ranked in left.items()}
        return row

    with log.writer() as add, tqdm(total=len(todo), desc=f"{cell.method} {cell.task}", disable=not progress) as bar:
        for i, (ex, _, stops) in enumerate(rendered):  # in the task's order: the corpus grows the same on a resume
            left = None
            if ex.id in done:
                row = parse_json(done[ex.id], str(journal))
                # ids of the runs' vocabulary: the union's where the set's tokenizers differ, not the first one's
                left = recycled_rows(row, runs.vocab) if corpus is not None else None
            else:
                row = measure(i, ex, stops)
                add(row)
                bar.update()
            if corpus is not None:  # searched by the prompts after this one, never by this one
                corpus.add_output(ex.id, row["token_ids"], left)
    rows = log.finish(out)  # every sample, each id once, in the task's order
    summary = write_speed(cell, out, rows, prompts) if speed else None
    if journal != out:
        journal.unlink()  # last: until here a crash leaves every sample in the journal
    return summary
