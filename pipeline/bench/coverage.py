"""How often a speed-up's interval covers the truth: an A/A study of the null cell (docs/speed.md, "Coverage").

The config's null cell (the large model timed side by side against itself, ``grid.null_cell``) is generated
``--repeats`` times, each run a fresh ``pipeline generate`` of its own cell file with its own seed (1, 2, ...), as
the workflow's generation rule runs it (one thread, OpenMP waiting passively); optionally beside a competitor
(``--competitor 'stress-ng --cpu 1'``, running the whole time). There is no effect to find, so the true speed-up is
1.00x: the share of runs whose 95% interval covers 1.00 is the interval's coverage. Every interval method of
``measure.ratios`` is computed on the same runs, so one study compares them. Prints a Markdown table; ``--json``
records every per-prompt time (``--from`` re-reads such a record and prints its table again, computing nothing
but the intervals).

    python -m pipeline.bench.coverage --repeats 40 --json benchmarks/coverage/<name>.json
    python -m pipeline.bench.coverage --from benchmarks/coverage/<name>.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from ..errors import UserError
from ..files import read_jsonl, read_user_json, write_atomic
from ..measure.ratios import METHODS, ratio_interval, ratio_of_totals
from ..measure.speed import Policy

SIDES = ("method", "baseline")
# the intervals compared: (label, method, run noise); the first is the default (``speed.Policy``)
INTERVALS = [
    (f"t, run noise {Policy().run_noise:.1%}", "t", Policy().run_noise),
    ("t, no run noise", "t", 0.0),
    *((m, m, 0.0) for m in METHODS if m != "t"),
]
RUN_TIMEOUT_S = 3600  # one run of the null cell: minutes at the default size


def null_cell(config: Path, size: int | None, max_new_tokens: int | None):
    """The config's null cell (``grid.null_cell``), at ``size`` prompts and ``max_new_tokens`` where given."""
    from ..experiment.checks import load_checked

    _, cells = load_checked(config)
    entry = next((c for c in cells.values() if c.dims.control == "null"), None)
    if entry is None:
        raise UserError(f"{config} has no null cell (timing: {{null: false}})")
    changes = {k: v for k, v in (("size", size), ("max_new_tokens", max_new_tokens)) if v is not None}
    return dataclasses.replace(entry, cell=dataclasses.replace(entry.cell, **changes))


def run_once(entry, seed: int, work: Path, timing: dict[str, Any]) -> list[dict[str, Any]]:
    """One fresh ``pipeline generate`` of the null cell with ``seed``: its per-prompt pairs (tokens and wall time
    of each side, which went first, whether the pair was interfered with)."""
    cell_file, out = work / f"null-{seed}.json", work / f"null-{seed}.jsonl"
    timing_file = work / "settings.json"  # the cell's timing section, as the workflow passes it
    dataclasses.replace(entry, cell=dataclasses.replace(entry.cell, seed=seed)).write(cell_file)
    write_atomic(timing_file, json.dumps(timing))
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE"}
    command = [sys.executable, "-m", "pipeline.cli", "generate", str(cell_file), str(out), "--threads", "1"]
    try:
        done = subprocess.run(
            [*command, "--timing-file", str(timing_file), "--no-speed"],
            env=env,
            capture_output=True,
            text=True,
            timeout=RUN_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired:
        raise UserError(f"pipeline generate (seed {seed}) ran past {RUN_TIMEOUT_S} s: is the machine busy?") from None
    if done.returncode:
        raise UserError(f"pipeline generate (seed {seed}) failed: {done.stderr.strip().splitlines()[-1:]}")
    pairs = []
    for i, row in enumerate(read_jsonl(out, "the samples pipeline generate wrote")):
        timing = row["timing"]["attempts"][row["timing"]["counted"]]
        sides = {"method": row["stats"], "baseline": row["baseline"]["stats"]}
        pairs.append(
            {
                "id": row["id"],
                **{f"{s}_{k}": sides[s][k] for s in SIDES for k in ("new_tokens", "wall_time_s")},
                "method_first": i % 2 == 0,  # job/generate.py alternates, the method first on even prompts
                "interfered": bool(timing["interfered"]),
                "beside": sorted({k for role in SIDES for k in ((timing.get(role) or {}).get("beside") or {})}),
            }
        )
    return pairs


def collect(args: argparse.Namespace) -> dict[str, Any]:
    """Every run of the study, with the settings and the machine it ran on."""
    from ..provenance import git_state, machine

    entry = null_cell(args.config, args.size, args.max_new_tokens)
    competitor = None
    if args.competitor:
        competitor = subprocess.Popen(shlex.split(args.competitor), stdout=subprocess.DEVNULL)
    runs, start = [], time.time()
    try:
        with tempfile.TemporaryDirectory() as work:
            for seed in range(1, args.repeats + 1):
                pairs = run_once(entry, seed, Path(work), {})  # timed and judged as the workflow does
                runs.append({"seed": seed, "pairs": pairs})
                est, low, high, _ = interval_of(pairs, *INTERVALS[0][1:])
                print(f"run {seed}: {est:.3f}x [{low:.3f}, {high:.3f}]", flush=True)
    finally:
        if competitor is not None:
            competitor.terminate()
            try:
                competitor.wait(timeout=10)
            except subprocess.TimeoutExpired:
                competitor.kill()
                competitor.wait(timeout=10)
    return {
        "study": "null cell, A/A",
        "cell": entry.dims.id,
        "size": entry.cell.size,
        "max_new_tokens": entry.cell.max_new_tokens,
        "temperature": entry.cell.temperature,
        "competitor": args.competitor,
        "seconds": round(time.time() - start, 1),
        "machine": machine(),
        **git_state(),
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "runs": runs,
    }


PAIR_KEYS = tuple(f"{s}_{k}" for s in SIDES for k in ("new_tokens", "wall_time_s"))


def record_problem(record: Any) -> str | None:
    """What keeps a coverage record from being read (None: nothing): an object whose ``runs`` each hold ``pairs``
    of positive, finite token counts and wall times, two pairs a run at least."""
    if not isinstance(record, dict) or not isinstance(record.get("runs"), list) or not record["runs"]:
        return "not an object with a list of runs"
    for i, run in enumerate(record["runs"]):
        pairs = run.get("pairs") if isinstance(run, dict) else None
        if not isinstance(pairs, list) or len(pairs) < 2 or not all(isinstance(p, dict) for p in pairs):
            return f"run {i} has no list of two pairs or more"
        for p in pairs:
            values = [p.get(k) for k in PAIR_KEYS]
            good = all(isinstance(v, int | float) and not isinstance(v, bool) and 0 < v < 1e12 for v in values)
            if not good:
                return f"run {i}: a pair without positive numbers for {', '.join(PAIR_KEYS)}"
    return None


def series(pairs: list[dict[str, Any]]) -> list[list[float]]:
    """A run's four per-prompt series: the method's tokens and wall time, the baseline's."""
    return [[p[f"{s}_{k}"] for p in pairs] for s in SIDES for k in ("new_tokens", "wall_time_s")]


def interval_of(pairs: list[dict[str, Any]], method: str, run_noise: float = 0.0) -> tuple[float, float, float, str]:
    """A run's speed-up and its interval by ``method`` (``run_noise``: the t interval's allowance)."""
    data = series(pairs)
    low, high, used = ratio_interval(*data, method=method, run_noise=run_noise)
    return ratio_of_totals(*data), low, high, used


def coverage(record: dict[str, Any]) -> list[dict[str, Any]]:
    """Per interval method: how many runs' intervals cover 1.00, their median half-width, and the Wilson interval
    of the coverage itself."""
    import numpy as np
    from scipy.stats import binomtest

    out = []
    for label, method, run_noise in INTERVALS:
        found = [interval_of(run["pairs"], method, run_noise) for run in record["runs"]]
        hits = sum(low <= 1.0 <= high for _, low, high, _ in found)
        n = len(found)
        ci = binomtest(hits, n).proportion_ci(method="wilson")
        widths = [(high - low) / 2 / est for est, low, high, _ in found]
        below = sum(high < 1.0 for _, _, high, _ in found)
        out.append(
            {
                "method": label,
                "runs": n,
                "cover": hits,
                "coverage": hits / n,
                "coverage_ci": [float(ci.low), float(ci.high)],
                "misses_below": below,
                "misses_above": n - hits - below,
                "median_halfwidth": float(np.median(widths)),
            }
        )
    return out


def table(record: dict[str, Any]) -> str:
    import numpy as np

    runs = record["runs"]
    pooled = [p for run in runs for p in run["pairs"]]
    estimates = [interval_of(run["pairs"], "t")[0] for run in runs]
    head = (
        f"{record['cell']}: {len(runs)} runs of {record['size']} prompts x {record['max_new_tokens']} new tokens, "
        f"T={record['temperature']:g}, {'beside ' + record['competitor'] if record['competitor'] else 'quiet'}; "
        f"{sum(p['interfered'] for p in pooled)} of {len(pooled)} pairs interfered; the runs' estimates "
        f"{np.mean(estimates):.3f}x on average (sd {np.std(estimates, ddof=1):.3f}), all pairs pooled "
        f"{interval_of(pooled, 't')[0]:.3f}x\n\n"
    )
    lines = [
        "| interval | covers 1.00 | coverage [95% Wilson] | misses below / above | median half-width |",
        "|---|---|---|---|---|",
    ]
    for c in coverage(record):
        lines.append(
            f"| {c['method']} | {c['cover']} of {c['runs']} | {c['coverage']:.0%} [{c['coverage_ci'][0]:.0%}, "
            f"{c['coverage_ci'][1]:.0%}] | {c['misses_below']} / {c['misses_above']} | ±{c['median_halfwidth']:.1%} |"
        )
    return head + "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipeline.bench.coverage", description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", type=Path, default=Path("config/default.yaml"), help="whose null cell")
    parser.add_argument("--repeats", type=int, default=40, help="runs of the null cell (default 40)")
    parser.add_argument("--size", type=int, help="prompts a run (default: the config's)")
    parser.add_argument("--max-new-tokens", type=int, help="new tokens a sample (default: the config's)")
    parser.add_argument("--competitor", help="a command run beside the whole study, e.g. 'stress-ng --cpu 1'")
    parser.add_argument("--json", type=Path, help="record every per-prompt time here (with --from: the record again)")
    parser.add_argument("--from", dest="source", type=Path, help="print the table of a recorded study")
    args = parser.parse_args(argv)
    if args.source is not None:
        record = read_user_json(args.source, "coverage record")
        if problem := record_problem(record):
            raise UserError(f"coverage record {args.source}: {problem}; expected what --json writes")
        if args.json:  # the record again, its coverage computed by today's intervals
            record["coverage"] = coverage(record)
            write_atomic(args.json, json.dumps(record, indent=1) + "\n")
    else:
        if args.repeats < 2:
            raise UserError(f"--repeats {args.repeats}: expected at least 2")
        record = collect(args)
        record["coverage"] = coverage(record)
        if args.json:
            write_atomic(args.json, json.dumps(record, indent=1) + "\n")
    print(table(record), end="")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except UserError as err:
        sys.exit(f"error: {err}")
