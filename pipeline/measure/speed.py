"""How speed is measured and reported: every speed figure of a cell (τ and acceptance: ``acceptance.py``), as
``docs/speed.md`` defines them. Speed is total new tokens over total wall time, never a mean of per-sample rates;
a speed-up is a method's speed over its standard method's, run side by side on the same prompts, with a seeded
paired-bootstrap interval over prompts (BCa, else the percentile interval where BCa is undefined); ``flags`` says
why a cell is ``unstable``, by ``Policy``'s thresholds."""

from __future__ import annotations

import json
import math
from collections import defaultdict
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from ..errors import UserError
from ..records import register, schema_of
from . import ratios
from .acceptance import decoding_metrics, union_metrics
from .cost import predicted_speedup
from .ratios import SPEEDUP, SPEEDUP_OVER_SPEEDUP, ratio_of_totals
from .timing import Thresholds


@dataclass(frozen=True)
class Policy:
    """How a cell is timed and judged (the config's ``timing`` section)."""

    confidence: float = 0.95
    interval: str = ratios.METHODS[0]  # how a speed-up's interval is made (ratios.METHODS; docs/speed.md)
    run_noise: float = 0.003  # a run's own noise beside its prompts' (the t interval's; the A/A study measured it)
    resamples: int = 10000
    seed: int = 0
    remeasure: int = 2  # re-runs of an interfered pair, at most
    wait_share: float = Thresholds.wait_share
    psi_share: float = Thresholds.psi_share
    nivcsw_per_s: float = Thresholds.nivcsw_per_s
    max_halfwidth: float = 0.08
    max_interfered: float = 0.25
    prediction_tolerance: float = 0.35
    near_tie_nats: float = 0.1  # exactness: a float64 gap below which a greedy mismatch is put down to numerics
    null: bool = True  # the run's own control: a null cell, the large model against itself (grid.null_cell)

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> Policy:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data or {}) - known)
        if unknown:
            raise UserError(f"unknown timing settings {unknown}; accepted: {', '.join(sorted(known))}")
        return cls(**(data or {}))

    def __post_init__(self):
        def bad(name: str, accepted: str) -> UserError:
            return UserError(f"timing.{name}={getattr(self, name)!r}: expected {accepted}")

        if not isinstance(self.confidence, int | float) or not 0 < self.confidence < 1:
            raise bad("confidence", "a number in (0, 1)")
        if not isinstance(self.null, bool):
            raise bad("null", "true or false")
        if self.interval not in ratios.METHODS:
            raise bad("interval", f"one of {', '.join(ratios.METHODS)}")
        for f in fields(self):  # the rest by the type of its default: counts, and finite numbers >= 0
            if f.name in ("confidence", "null", "interval"):
                continue
            value, count, floor = getattr(self, f.name), isinstance(f.default, int), 100 if f.name == "resamples" else 0
            kind_ok = not isinstance(value, bool) and isinstance(value, int if count else int | float)
            if not kind_ok or not floor <= value < math.inf:
                raise bad(f.name, f"an integer >= {floor}" if count else "a finite number >= 0")

    @property
    def thresholds(self) -> Thresholds:
        return Thresholds(self.wait_share, self.psi_share, self.nivcsw_per_s)


# ---- ratios and intervals (measure/ratios.py) -----------------------------------------------------


def _ratio(tm, wm, tb, wb) -> float:
    return ratio_of_totals(tm, wm, tb, wb)


def ratio_interval(
    tokens_m, wall_m, tokens_b, wall_b, policy: Policy = Policy()
) -> tuple[float | None, float | None, str | None]:
    """An interval for the ratio of (total tokens / total wall) of two paired series, by ``policy.interval``.

    Returns ``(low, high, method)``; ``(None, None, None)`` with fewer than two pairs.
    """
    return _interval([tokens_m, wall_m, tokens_b, wall_b], SPEEDUP, policy)


def series_speedup(
    a: list[tuple[int, float]], b: list[tuple[int, float]], policy: Policy = Policy()
) -> tuple[float, float | None, float | None]:
    """``(ratio, low, high)``: ``a``'s total tokens per total second over ``b``'s, two series of
    (tokens, seconds) paired by position (prompts, or rounds of a benchmark), with its interval."""
    (ta, wa), (tb, wb) = zip(*a), zip(*b)
    low, high, _ = ratio_interval(ta, wa, tb, wb, policy)
    return _ratio(ta, wa, tb, wb), low, high


def relative_speedup(
    rows_a: list[dict[str, Any]], rows_b: list[dict[str, Any]], policy: Policy = Policy()
) -> tuple[float, float | None, float | None] | None:
    """Cell a's side-by-side speed-up over cell b's, prompts paired by id, with its interval.

    Each speed-up is over the standard method run beside it in the same job, so a drift between the two
    jobs (another job on the machine) cancels; for two cells with the same standard (``sd`` and
    ``hf_assisted``: the large model) it estimates a's speed over b's. None without paired samples.
    """
    b = {r["id"]: r for r in rows_b if "baseline" in r}
    pairs = [(r, b[r["id"]]) for r in rows_a if "baseline" in r and r["id"] in b]
    sides = zip(*[(a, a["baseline"], x, x["baseline"]) for a, x in pairs])  # a, its baseline, b, its baseline
    series = [[(r["stats"]["new_tokens"], r["stats"]["wall_time_s"]) for r in rows] for rows in sides]
    return speedup_ratio(*series, policy) if pairs else None


def speedup_ratio(
    a: list[tuple[int, float]],
    a_base: list[tuple[int, float]],
    b: list[tuple[int, float]],
    b_base: list[tuple[int, float]],
    policy: Policy = Policy(),
) -> tuple[float, float | None, float | None] | None:
    """(a over a_base) over (b over b_base): four per-prompt series of (tokens, wall), paired by position,
    with its interval. None without prompts or with a zero total."""
    if not a:
        return None
    data = [list(x) for series in (a, a_base, b, b_base) for x in zip(*series)]
    if not all(sum(x) for x in data):
        return None
    low, high, _ = _interval(data, SPEEDUP_OVER_SPEEDUP, policy, runs=2)  # each speed-up its own run's noise
    return ratio_of_totals(*data, signs=SPEEDUP_OVER_SPEEDUP), low, high


def _interval(series, signs, policy: Policy, runs: int = 1) -> tuple[float | None, float | None, str | None]:
    """The interval of a ratio of totals (``ratios.ratio_interval``) by the policy's method and settings; ``runs``:
    how many runs' noise it holds (a speed-up over another cell's: two jobs, each with its own)."""
    return ratios.ratio_interval(
        *series,
        signs=signs,
        method=policy.interval,
        confidence=policy.confidence,
        resamples=policy.resamples,
        seed=policy.seed,
        run_noise=policy.run_noise * math.sqrt(runs),
    )


def halfwidth(estimate: float | None, low: float | None, high: float | None) -> float | None:
    """The interval's half-width as a share of the estimate."""
    if estimate is None or low is None or high is None or not estimate:
        return None
    return (high - low) / 2 / estimate


def _missing(x: Any) -> bool:
    return x is None or (isinstance(x, float) and math.isnan(x))


def fmt(value: float | None, low: float | None = None, high: float | None = None, unstable: bool = False) -> str:
    """A speed-up as the tables show it: ``1.55x [1.47, 1.63]``, `` (unstable)`` after a flagged one."""
    if _missing(value):
        return "-"
    text = f"{value:.2f}x"
    if not _missing(low) and not _missing(high):
        text += f" [{low:.2f}, {high:.2f}]"
    return text + (" (unstable)" if unstable else "")


# ---- a cell --------------------------------------------------------------------------------------


def paired_speedup(pairs: list[tuple[dict[str, Any], dict[str, Any]]], policy: Policy) -> tuple | None:
    """``(estimate, low, high, interval method)`` of a method's speed over its baseline's on paired prompts (each
    pair: the two samples' stats); None without pairs or when a total is zero."""
    if not pairs:
        return None
    tm, wm, tb, wb = ([s[k] for s in side] for side in zip(*pairs) for k in ("new_tokens", "wall_time_s"))
    if not sum(tm) or not sum(wm) or not sum(wb) or not sum(tb):
        return None
    return (_ratio(tm, wm, tb, wb), *ratio_interval(tm, wm, tb, wb, policy))


def _side_by_side(rows: list[dict[str, Any]], policy: Policy) -> dict[str, Any]:
    pairs = [(r["stats"], r["baseline"]["stats"]) for r in rows]
    found = paired_speedup(pairs, policy)
    if found is None:
        return {}
    estimate, low, high, method = found
    return {
        "baseline_tokens_per_s": sum(b["new_tokens"] for _, b in pairs) / sum(b["wall_time_s"] for _, b in pairs),
        "speedup_side_by_side": estimate,
        "speedup_ci_low": low,
        "speedup_ci_high": high,
        "speedup_ci_method": method,
        "speedup_halfwidth": halfwidth(estimate, low, high),
    }


def _shown(*where: str, optional: bool = False, columns: tuple[str, ...] = ()) -> Any:
    """A field of ``SpeedSummary``: where it is shown (``figure``: the long frame of figures; ``column``: cells.csv,
    as ``columns`` where it is shown as several; ``published``: results.json's speed record) and whether its JSON
    form leaves it out when there is nothing to say (a cell without a baseline has no speed-up)."""
    return field(default=None, metadata={"shown": where, "optional": optional, "columns": columns})


@dataclass(frozen=True)
class SpeedSummary:
    """A cell's speed record, its ``.speed.json`` (``summarize``): speed, interval, τ, acceptance, interference,
    flags. One JSON form (``to_json`` / ``from_json``), its keys in the order of the fields; which of them the
    figures, cells.csv and results.json show is said here, by each field (``figure``, ``column``,
    ``published``)."""

    samples: int = _shown("figure", "column", "published")
    new_tokens: int = _shown("figure", "column", "published")
    wall_time_s: float = _shown("published")
    tokens_per_s: float | None = _shown("figure", "column", "published")
    baseline_tokens_per_s: float | None = _shown("figure", "column", "published", optional=True)
    speedup_side_by_side: float | None = _shown("figure", "column", "published", optional=True)
    speedup_ci_low: float | None = _shown("column", "published", optional=True)
    speedup_ci_high: float | None = _shown("column", "published", optional=True)
    speedup_ci_method: str | None = _shown("published", optional=True)
    speedup_halfwidth: float | None = _shown(optional=True)
    tau: float | None = _shown("figure", "column", "published")
    tau_by_model: list | None = _shown("figure", "column", "published")
    acceptance_rate: float | None = _shown("figure", "column", "published")
    draft_acceptance_rate: float | None = _shown("figure", "column", "published")
    ceiling: float | None = _shown("figure", "column", "published", optional=True)
    proposal_cost: float | None = _shown("figure", "column", "published", optional=True)
    position_acceptance: list | None = _shown("figure", "column")
    predicted_speedup: float | None = _shown("figure", "column", "published", optional=True)
    exactness: dict | None = _shown(
        "column",
        optional=True,
        columns=("exact_match", "mismatches_numerics", "mismatches_bug", "mismatches_unchecked"),
    )
    pairs_interfered: int = _shown("figure", "column", "published")
    pairs_remeasured: int = _shown("figure", "column", "published")
    overhead: float | None = _shown("figure", "column", "published")
    union_size: int | None = _shown("figure", "column", "published")
    union_map_s: float | None = _shown("figure", "column", "published")
    confidence: float = _shown("published")
    policy: dict | None = _shown()
    beside: dict | None = _shown()
    provenance: Any = _shown("published")
    runs: list | None = _shown()
    by_category: dict | None = _shown(optional=True)
    unstable: bool = _shown("column", "published")
    flags: list | None = _shown("column", "published")

    @classmethod
    def shown(cls, where: str) -> tuple[str, ...]:
        """The names shown ``where`` (``figure``, ``column``, ``published``), in order; a field shown as several
        columns gives their names."""
        return tuple(
            name
            for f in fields(cls)
            if where in f.metadata["shown"]
            for name in (f.metadata["columns"] if where == "column" and f.metadata["columns"] else (f.name,))
        )

    @classmethod
    def columns_of(cls, name: str) -> tuple[str, ...]:
        """The cells.csv columns field ``name`` is shown as."""
        return cls.__dataclass_fields__[name].metadata["columns"] or (name,)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SpeedSummary:
        if unknown := sorted(set(data) - set(cls.__dataclass_fields__)):
            raise UserError(f"unknown speed record keys {unknown}; accepted: {', '.join(cls.__dataclass_fields__)}")
        return cls(**data)

    def to_json(self) -> dict[str, Any]:
        return {
            f.name: getattr(self, f.name)
            for f in fields(self)
            if not (f.metadata["optional"] and getattr(self, f.name) is None)
        }


def summarize(rows: list[dict[str, Any]], policy: Policy = Policy(), exactness: dict | None = None) -> SpeedSummary:
    """A cell's speed summary (its ``.speed.json``): speed, interval, τ, acceptance, interference, flags."""
    stats = [r["stats"] for r in rows]
    tokens = sum(s["new_tokens"] for s in stats)
    wall = sum(s["wall_time_s"] for s in stats)
    summary: dict[str, Any] = {
        "samples": len(rows),
        "new_tokens": tokens,
        "wall_time_s": wall,
        "tokens_per_s": tokens / wall if wall else None,
        **decoding_metrics(stats),
        **union_metrics(stats),
        "overhead": 1 - sum(s["forward_time_s"] for s in stats) / wall if wall else None,
        "confidence": policy.confidence,
        "policy": asdict(policy),
    }
    paired = bool(rows) and all("baseline" in r for r in rows)
    if paired:
        summary.update(_side_by_side(rows, policy))
        summary["predicted_speedup"] = predicted_speedup(rows)
    timed = [r["timing"] for r in rows if "timing" in r]
    counted = [t["attempts"][t["counted"]] for t in timed]
    hit = [policy.thresholds.worst(a) > 1 for a in counted]  # judged by today's thresholds: recalibrating re-judges
    summary["pairs_interfered"] = sum(hit)
    summary["pairs_remeasured"] = sum(len(t["attempts"]) > 1 for t in timed)
    summary["beside"] = beside_pairs(counted, hit)
    hosts = {json.dumps(r.get("provenance"), sort_keys=True) for r in rows}  # no record: a host of its own
    summary["provenance"] = (rows[0].get("provenance") if rows else None) if len(hosts) <= 1 else sorted(hosts)
    summary["runs"] = runs(rows)
    if exactness is not None:
        summary["exactness"] = exactness
    categories = defaultdict(list)
    for r in rows:
        if r.get("category"):
            categories[r["category"]].append(r)
    if categories:
        summary["by_category"] = {
            c: {
                "samples": len(rs),
                "tokens_per_s": sum(r["stats"]["new_tokens"] for r in rs) / sum(r["stats"]["wall_time_s"] for r in rs),
                "tau": decoding_metrics([r["stats"] for r in rs])["tau"],
                **(_side_by_side(rs, policy) if paired else {}),
            }
            for c, rs in sorted(categories.items())
        }
    summary["flags"] = flags(summary, policy)
    summary["unstable"] = bool(summary["flags"])
    return SpeedSummary.from_json(summary)


def runs(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The runs that generated a cell's samples (``timing.run_record``), in order, each with its number of samples:
    one run, or a resume (a crash, a preemption, a SLURM requeue: ``restarts``)."""
    out: dict[str, dict[str, Any]] = {}
    for r in rows:
        run = r.get("run") if isinstance(r.get("run"), dict) else {}
        entry = out.setdefault(json.dumps(run, sort_keys=True), {**run, "samples": 0})
        entry["samples"] += 1
    return list(out.values())


def beside_pairs(attempts: list[dict[str, Any]], hit: list[bool]) -> dict[str, dict[str, Any]]:
    """What ran beside a cell's counted pairs (``timing.beside``), by process: in how many pairs it took CPU time,
    how many of those were interfered, and its CPU seconds in all; the most frequent first."""
    out: dict[str, dict[str, Any]] = {}
    for attempt, interfered in zip(attempts, hit):
        took: dict[str, float] = {}
        for role in ("method", "baseline"):
            for label, seconds in ((attempt.get(role) or {}).get("beside") or {}).items():
                took[label] = took.get(label, 0.0) + seconds
        for label, seconds in took.items():
            entry = out.setdefault(label, {"pairs": 0, "interfered": 0, "cpu_s": 0.0})
            entry["pairs"] += 1
            entry["interfered"] += interfered
            entry["cpu_s"] = round(entry["cpu_s"] + seconds, 3)
    return dict(sorted(out.items(), key=lambda kv: (-kv[1]["pairs"], kv[0])))


def flags(summary: dict[str, Any], policy: Policy) -> list[str]:
    """Why a cell's speed-up should not be trusted as it stands (empty: nothing found)."""
    out = []
    hw = summary.get("speedup_halfwidth")
    if hw is not None and hw > policy.max_halfwidth:
        out.append(f"interval ±{hw:.0%} wider than ±{policy.max_halfwidth:.0%}")
    n = summary["samples"]
    if n and summary["pairs_interfered"] / n > policy.max_interfered:
        out.append(f"{summary['pairs_interfered']} of {n} pairs interfered after re-measuring")
    if isinstance(summary.get("provenance"), list):
        out.append(f"samples timed on {len(summary['provenance'])} different machines or settings")
    est, pred = summary.get("speedup_side_by_side"), summary.get("predicted_speedup")
    if est is not None and pred:
        slack = (hw or 0) * est + policy.prediction_tolerance * pred
        if abs(est - pred) > slack:
            out.append(f"measured {est:.2f}x is off the cost model's {pred:.2f}x")
    return out


SPEED_RECORD = "speed record"  # its record type (``records.py``): its readers name it from here
register(SPEED_RECORD, schema_of(SpeedSummary))  # a cell's .speed.json, checked where it is read (records.py)
