"""Weights & Biases logging of one scored cell.

One W&B run per cell, grouped by experiment: the cell's dimensions and
settings as config; tokens/s, speed-up, acceptance and quality as summary
metrics; per-sample speed as history; and a table of samples. ``auto`` mode
is online when an API key is configured (``WANDB_API_KEY`` or ``wandb
login``), else offline (upload later with ``wandb sync results/wandb/offline-run-*``).
``WANDB_MODE`` in the environment wins over the config.

Logging never fails the workflow: any W&B error is written to the status
file and printed; the files under ``results/`` are the source of truth.
"""

from __future__ import annotations

import contextlib
import json
import netrc
import os
from pathlib import Path
from typing import Any

from .scoring import read_jsonl, write_atomic


def resolve_mode(mode: str) -> str:
    env = os.environ.get("WANDB_MODE")
    if env:
        return {"dryrun": "offline", "run": "online"}.get(env, env)
    if mode != "auto":
        return mode
    if os.environ.get("WANDB_API_KEY"):
        return "online"
    try:
        if netrc.netrc().authenticators("api.wandb.ai"):
            return "online"
    except (OSError, netrc.NetrcParseError):
        pass
    return "offline"


def cell_metrics(samples: Path) -> dict[str, Any]:
    """Summary metrics of a cell from its files: speed (``.speed.json``) and quality (``.summary.json``)."""
    speed = json.loads(samples.with_suffix(".speed.json").read_text())
    out = {f"speed/{k}": v for k, v in speed.items() if isinstance(v, int | float)}
    summary_path = samples.with_suffix(".summary.json")
    if summary_path.exists():
        quality = json.loads(summary_path.read_text())
        out.update({f"quality/{k}": v for k, v in quality.items() if isinstance(v, int | float) and k != "samples"})
    return out


def log_cell(
    samples: Path,
    status: Path,
    dims: dict[str, Any],
    cell: dict[str, Any] | None = None,
    experiment: str = "default",
    project: str = "specens",
    entity: str | None = None,
    mode: str = "auto",
    wandb_dir: Path = Path("results"),
) -> dict[str, Any]:
    """Log a cell as one W&B run; write and return the outcome (never raises for W&B errors)."""
    samples, status = Path(samples), Path(status)
    mode = resolve_mode(mode)
    outcome: dict[str, Any] = {"mode": mode, "cell": dims.get("id")}
    if mode == "disabled":
        outcome["status"] = "disabled"
        write_atomic(status, json.dumps(outcome, indent=2) + "\n")
        return outcome
    rows = read_jsonl(samples)
    scores_path = samples.with_suffix(".scores.jsonl")
    scores = {r["id"]: r for r in read_jsonl(scores_path)} if scores_path.exists() else {}
    run = None
    try:
        import wandb

        wandb_dir.mkdir(parents=True, exist_ok=True)
        config = {**dims, **{k: v for k, v in (cell or {}).items() if k not in ("models", "baseline_args")}}
        config["models"] = dims.get("models")
        run = wandb.init(
            project=project,
            entity=entity,
            group=experiment,
            job_type=dims.get("method", "generate"),
            name=dims.get("id"),
            config=config,
            dir=str(wandb_dir),
            mode=mode,
            settings=wandb.Settings(silent=True, x_disable_stats=True, console="off"),
        )
        columns = ["id", "output", "new_tokens", "tokens_per_s", "accepted_per_round", "baseline_output", "score"]
        table = wandb.Table(columns=columns)
        for i, row in enumerate(rows):
            st = row["stats"]
            tps = st["new_tokens"] / st["wall_time_s"] if st["wall_time_s"] else None
            metrics = {"sample/new_tokens": st["new_tokens"], "sample/tokens_per_s": tps}
            if st.get("mean_accepted_per_round") is not None:
                metrics["sample/accepted_per_round"] = st["mean_accepted_per_round"]
            if "baseline" in row:
                b = row["baseline"]["stats"]
                if b["wall_time_s"] and tps:
                    metrics["sample/speedup_side_by_side"] = tps / (b["new_tokens"] / b["wall_time_s"])
            run.log(metrics, step=i)
            score = {k: v for k, v in scores.get(row["id"], {}).items() if k != "id"}
            table.add_data(
                row["id"],
                row["output"],
                st["new_tokens"],
                tps,
                st.get("mean_accepted_per_round"),
                row.get("baseline", {}).get("output"),
                json.dumps(score),
            )
        run.log({"samples": table}, step=len(rows))
        run.summary.update(cell_metrics(samples))
        outcome.update(status="ok", run_id=run.id, run_dir=str(Path(run.dir).parent))
        run.finish()
    except Exception as err:  # W&B must never cost a result
        first_line = (str(err).splitlines() or [""])[0][:200]
        outcome.update(status="failed", error=f"{type(err).__name__}: {first_line}".rstrip(": "))
        print(f"warning: W&B logging failed for {dims.get('id')}: {outcome['error']}; results/ is unaffected")
        if run is not None:
            with contextlib.suppress(Exception):
                run.finish(exit_code=1)
    write_atomic(status, json.dumps(outcome, indent=2) + "\n")
    return outcome
