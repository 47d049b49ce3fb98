"""Weights & Biases logging (docs/workflow.md, "W&B"): one run per cell (``job_type`` "cell") and one per
experiment (``job_type`` "aggregate", its tables), grouped by experiment; a run's id derives from the experiment
and the cell (``run_id``), so logging again resumes it. W&B never touches a result: the files under ``results/``
are the source of truth, and a failure is recorded and fails the job so that the next run retries it (``_logged``).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import netrc
import os
import shutil
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import one_line
from ..experiment.paths import FAILED, Results, beside
from ..files import read_jsonl, read_user_json, write_atomic
from ..measure.speed import SPEED_RECORD
from ..records import read_record

if TYPE_CHECKING:
    from ..experiment.cell import CellFile


def resolve_mode(mode: str) -> str:
    env = os.environ.get("WANDB_MODE")
    if env:
        return {"dryrun": "offline", "run": "online"}.get(env, env)
    if mode != "auto":
        return mode
    if os.environ.get("WANDB_API_KEY"):
        return "online"
    with contextlib.suppress(OSError, netrc.NetrcParseError):
        if netrc.netrc().authenticators("api.wandb.ai"):
            return "online"
    return "offline"


def cell_metrics(samples: Path) -> dict[str, Any]:
    """Summary metrics of a cell from its files: speed with its interval and flags (``.speed.json``),
    exactness, and quality (``.summary.json``)."""
    speed = read_record(beside(samples, "speed"), SPEED_RECORD)
    out = {f"speed/{k}": v for k, v in speed.items() if isinstance(v, int | float)}
    if speed.get("flags") is not None:
        out["speed/flags"] = "; ".join(speed["flags"])
    if exact := speed.get("exactness"):
        out["exactness/rate"] = exact["rate"]
        out["exactness/numerics"] = exact.get("numerics", 0)
        out["exactness/bugs"] = exact.get("bugs", 0)
    summary_path = beside(samples, "summary")
    if summary_path.exists():
        quality = read_record(summary_path, "score summary")
        out.update({f"quality/{k}": v for k, v in quality.items() if isinstance(v, int | float) and k != "samples"})
    return out


class WandbFailed(RuntimeError):
    """Logging a cell failed; the job fails so that the next workflow run retries it (results/ is untouched)."""


def run_id(experiment: str, name: str) -> str:
    """The W&B run id of a cell (or of the experiment's own run): the same for every logging of it, so that a
    rerun resumes the run instead of adding a second one."""
    return hashlib.sha256(f"{experiment}\0{name}".encode()).hexdigest()[:24]


def run_config(entry: CellFile | None) -> dict[str, Any]:
    """A cell's W&B config: its dims and its settings (the method among them), its models by name."""
    if entry is None:
        return {}
    dims = entry.dims.to_json() if entry.dims else {}
    cell = {k: v for k, v in entry.cell.to_json().items() if k not in ("models", "baseline_args")}
    return {**dims, **cell, "models": dims.get("models")}


def log_cell(
    samples: Path, status: Path, entry: CellFile | None, wandb_dir: Path = Path("results"), **settings
) -> dict[str, Any]:
    """Log a cell as one W&B run (``job_type`` "cell", the method in its config) and write the outcome to
    ``status``; ``settings``: ``RunSpec``'s experiment, project, entity, mode and init_timeout."""
    samples = Path(samples)
    name = entry.dims.id if entry and entry.dims else None
    run = RunSpec(name or samples.stem, name, "cell", **settings)
    return _logged(status, run, partial(_log_cell, samples, run_config(entry)), wandb_dir)


def log_experiment(
    results: Path, status: Path, wandb_dir: Path | None = None, experiment: str = "default", **settings
) -> dict[str, Any]:
    """Log the experiment's aggregate tables (``results/tables/*.csv``, the summary) as one W&B run of its own
    (``job_type`` "aggregate", in the experiment's group beside its cells' runs); failures as for log_cell."""
    results = Path(results)
    run = RunSpec("experiment", experiment, "aggregate", experiment, **settings)
    return _logged(status, run, partial(_log_tables, Results(results)), wandb_dir or results)


@dataclass(frozen=True)
class RunSpec:
    """Who a W&B run is: its name, function (``job_type``), where it goes and how it is logged."""

    key: str  # what its stable id derives from, with the experiment (``run_id``)
    name: str | None
    job_type: str
    experiment: str = "default"
    project: str = "specens"
    entity: str | None = None
    mode: str = "auto"
    init_timeout: float = 15.0  # seconds to wait for the server

    @property
    def id(self) -> str:
        return run_id(self.experiment, self.key)


def _logged(status, run: RunSpec, fill, wandb_dir) -> dict[str, Any]:
    """Log one run (``fill(wandb_run)`` writes its content) and record the outcome in ``status``.

    A failure writes ``<status>.failed.json`` instead (the error and, for an online run, the offline copy
    made in its place for ``wandb sync``) and raises WandbFailed: ``status`` stays absent, so the workflow
    runs the job again next time; a later success removes the offline copy, so nothing is synced twice.
    Waiting for an unreachable server is bounded by ``init_timeout`` seconds.
    """
    status, wandb_dir = Path(status), Path(wandb_dir)
    failed = status.with_suffix(FAILED)
    mode = resolve_mode(run.mode)
    outcome: dict[str, Any] = {"mode": mode, "cell": run.name} if run.job_type == "cell" else {"mode": mode}
    if mode == "disabled":
        outcome["status"] = "disabled"
        write_atomic(status, json.dumps(outcome, indent=2) + "\n")
        return outcome
    log = partial(_log_run, run, fill, wandb_dir=wandb_dir)
    try:
        logged_id, run_dir = log(mode)
    except Exception as err:  # W&B must never cost a result: record, keep an offline copy, let the job be retried
        outcome.update(status="failed", error=one_line(err))
        if mode == "online":
            _forget_fallback(failed, wandb_dir)
            try:
                outcome["offline_copy"] = str(log("offline")[1])
            except Exception as offline_err:
                outcome["offline_error"] = one_line(offline_err)
        write_atomic(failed, json.dumps(outcome, indent=2) + "\n")
        kept = f"; an offline copy is in {outcome['offline_copy']}" if "offline_copy" in outcome else ""
        advice = " (wandb.mode: offline stops trying online)" if mode == "online" else ""
        raise WandbFailed(
            f"W&B logging failed for {run.name}: {outcome['error']}{kept}; results/ is unaffected; the "
            f"next workflow run tries again{advice}"
        ) from None
    _forget_fallback(failed, wandb_dir)  # this run replaces an earlier attempt's offline copy, whatever the mode now
    failed.unlink(missing_ok=True)
    outcome.update(status="ok", run_id=logged_id, run_dir=str(run_dir))
    write_atomic(status, json.dumps(outcome, indent=2) + "\n")
    return outcome


def _forget_fallback(failed: Path, wandb_dir: Path) -> None:
    """Remove the offline copy an earlier failed online attempt left (this attempt replaces it): only a run
    directory of W&B's own under ``wandb_dir`` (``wandb/offline-run-*``), never a path the file names elsewhere
    or a link."""
    if not failed.exists():
        return
    with contextlib.suppress(OSError, ValueError, TypeError, AttributeError):
        copy = Path(read_user_json(failed, "W&B failure record", links=False).get("offline_copy"))
        own = copy.parent.resolve() == (wandb_dir / "wandb").resolve() and copy.name.startswith("offline-run-")
        if own and not copy.is_symlink():
            shutil.rmtree(copy, ignore_errors=True)


def _log_run(run_spec: RunSpec, fill, mode, wandb_dir) -> tuple[str, Path]:
    """One W&B run, resumed when its id was logged before; returns its id and directory. Raises whatever W&B
    raises (the stub of this attempt removed)."""
    import wandb

    wandb_dir.mkdir(parents=True, exist_ok=True)
    before = set((wandb_dir / "wandb").glob(f"*run-*-{run_spec.id}"))
    run = None
    try:
        run = wandb.init(
            project=run_spec.project,
            entity=run_spec.entity,
            group=run_spec.experiment,
            job_type=run_spec.job_type,
            name=run_spec.name,
            id=run_spec.id,
            resume="allow",
            dir=str(wandb_dir),
            mode=mode,
            settings=wandb.Settings(
                silent=True, x_disable_stats=True, console="off", init_timeout=run_spec.init_timeout
            ),
        )
        fill(run)
        run_dir = Path(run.dir).parent
        run.finish()
        return run.id, run_dir
    except BaseException:
        if run is not None:
            with contextlib.suppress(Exception):
                run.finish(exit_code=1)
        with contextlib.suppress(Exception):  # W&B's service keeps a failed run's id in use: start afresh
            wandb.teardown()
        for path in set((wandb_dir / "wandb").glob(f"*run-*-{run_spec.id}")) - before:  # this attempt's stub
            shutil.rmtree(path, ignore_errors=True)
        raise


def _log_cell(samples: Path, config: dict[str, Any], run) -> None:
    """A cell's run: its dimensions and settings (the method among them) as config, per-sample history, a table
    of samples, the summary metrics."""
    import wandb

    rows = read_jsonl(samples, links=False)
    scores_path = beside(samples, "scores")
    scores = {r["id"]: r for r in read_jsonl(scores_path, links=False)} if scores_path.exists() else {}
    run.config.update(config, allow_val_change=True)
    table = wandb.Table(columns=["id", "output", "new_tokens", "tokens_per_s", "tau", "baseline_output", "score"])
    for row in rows:
        st = row["stats"]
        tps = st["new_tokens"] / st["wall_time_s"] if st["wall_time_s"] else None
        metrics = {"sample/new_tokens": st["new_tokens"], "sample/tokens_per_s": tps}
        if st.get("tau") is not None:
            metrics["sample/tau"] = st["tau"]
        if "timing" in row:
            counted = row["timing"]["attempts"][row["timing"]["counted"]]
            metrics["sample/interfered"] = int(counted["interfered"])
            metrics["sample/attempts"] = len(row["timing"]["attempts"])
        base = row.get("baseline", {})
        b = base.get("stats", {})
        if b.get("wall_time_s") and b.get("new_tokens") and tps:
            # a sample's own ratio, not the cell's speed-up (a ratio of totals, ``speed/speedup_side_by_side``)
            metrics["sample/tokens_per_s_ratio"] = tps / (b["new_tokens"] / b["wall_time_s"])
        run.log(metrics)
        score = json.dumps({k: v for k, v in scores.get(row["id"], {}).items() if k != "id"})
        table.add_data(row["id"], row["output"], st["new_tokens"], tps, st.get("tau"), base.get("output"), score)
    run.log({"samples": table})
    run.summary.update(cell_metrics(samples))


def _log_tables(files: Results, run) -> None:
    """The experiment's run: each aggregate table (CSV) as a W&B table, the summary as text, and the run's control
    (``control/covers``, ``control/speedup`` and its interval; ``control/line`` when it missed, the run flagged)."""
    import pandas as pd
    import wandb

    for path in sorted(files.tables.glob("*.csv")):
        run.log({f"tables/{path.stem}": wandb.Table(dataframe=pd.read_csv(path))})
    summary = files.summary
    if summary.exists():
        run.summary["summary_md"] = summary.read_text()
    if files.results_file.exists():  # the run's control (report/control.py): its null cell, and the flag if it missed
        control = read_user_json(files.results_file, "results file", links=False).get("control") or {}
        run.summary.update({f"control/{k}": v for k, v in control.items() if v is not None})
