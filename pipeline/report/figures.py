"""An experiment's figures in one long frame, read once from its files (``collect`` returns ``Collected``).

``cells``: one row per finished cell of the grid, its dims (``grid_dims``), ``T``, ``unstable`` and ``flags``.
``figures``: one row per figure (``FIGURE``): its cell, metric (a speed record's name, ``q:<name>`` for a task
metric, ``speedup_vs_standard``/``speedup_vs_large`` across cells, ``speedup_vs_peer``), category (a Spec-Bench
category, the peer, or the model/position of a list such as ``tau_by_model``; empty for the whole cell), value (as
read), its interval (low, high; NaN without one) and whether it is unstable. ``scored``: the log-likelihood
figures, per distribution. ``reported``: the paper's figures, when they name this experiment.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from ..decoding.engines import ENGINES
from ..decoding.spec import parse_method
from ..errors import UserError
from ..experiment.cell import GRID, Dims
from ..experiment.paths import Results, beside, cell_path
from ..files import ResultsError, read_jsonl
from ..measure.intervals import bootstrap_interval
from ..measure.speed import (
    SPEED_RECORD,
    Policy,
    SpeedSummary,
    halfwidth,
    paired_speedup,
    relative_speedup,
    speedup_ratio,
)
from ..records import read_record
from .control import Control, null_control
from .results_file import RATIOS, load_reported

ROW = ["model_set", "method", "T"]
NULL_LABEL = "{method} vs itself (null)"  # how the tables name the null cell (grid.null_cell)
CELL = [*ROW, "gamma", "dataset"]  # one cell of a table
FIGURE = ["cell", "metric", "category", "value", "low", "high", "unstable"]
# other engines' methods (transformers' ``hf_*``, vLLM's ``vllm_*``): the kinds their records name
PEER_KINDS = tuple(engine.peer_kind for engine in ENGINES.values() if engine.peer_kind)
SPEED = SpeedSummary.shown("figure")  # a speed record's own figures
LISTS = ("tau_by_model", "position_acceptance")  # one figure per model of the set / per position of a block
# the exactness record's figures: cells.csv's columns (``SpeedSummary.exactness``) and the keys they show
EXACTNESS = dict(zip(SpeedSummary.columns_of("exactness"), ("rate", "numerics", "bugs", "unchecked"), strict=True))


@dataclass
class Collected:
    cells: pd.DataFrame
    figures: pd.DataFrame
    scored: pd.DataFrame
    confidence: float
    reported: dict[str, Any] | None
    drafts: pd.DataFrame  # the distilled models the grid uses: how each was trained, how well it proposes
    beside: pd.DataFrame  # what ran beside each cell's timed pairs (``beside_runs``)
    records: dict[str, dict[str, Any]]  # each finished cell's speed record and score summary, as read once
    control: Control  # the run's control: the null cell's interval, and the line that flags the run when it misses


def _record(path: Path, kind: str, what: str) -> Any:
    """A results file the aggregate reads, checked against its record type (``records.py``); one line naming it
    when it is damaged (its job makes it again once it is deleted)."""
    try:
        return read_record(path, kind, what)
    except UserError as err:
        raise ResultsError(f"{err}; delete it and run the workflow again") from None


def speed_record(path: Path) -> dict[str, Any]:
    """A cell's ``.speed.json``, checked against its type (``SpeedSummary``'s schema: a key it does not know, or a
    value of another type, is one line naming the file) and kept as written (a key a record lacks stays absent)."""
    return _record(path, SPEED_RECORD, "the speed record")


def grid_dims(results: Path) -> list[dict[str, Any]]:
    """The dims of each cell of the grid (``grid.json``, written by the workflow), in the grid's order, read
    through the one type of a cell's dimensions (``cell.Dims``), in grid.json's key order (cells.csv's columns)."""
    return [{**d, **Dims.from_json(d).to_json()} for d in _record(Results(results).grid, GRID, "the grid index")]


def cell_figures(cell: str, speed: dict[str, Any], summary: dict[str, Any]) -> list[tuple]:
    """A cell's figures: its speed record's (``.speed.json``) and its task metrics' (``.summary.json``)."""
    out, unstable, exact = [], bool(speed.get("unstable")), speed.get("exactness") or {}

    def add(metric, value, low=None, high=None, category="", unstable=unstable):
        if value is not None or metric in LISTS:  # a list's missing figure kept in its place (shown "-")
            out.append((cell, metric, category, value, low, high, unstable))

    def side_by_side(record):  # a speed-up measured beside its baseline in the same job, with its interval
        return record.get("speedup_side_by_side"), record.get("speedup_ci_low"), record.get("speedup_ci_high")

    for metric in SPEED:
        if metric in LISTS:
            for i, value in enumerate(speed.get(metric) or [], 1):
                add(metric, value, category=str(i))
        else:
            add(metric, *(side_by_side(speed) if metric == "speedup_side_by_side" else [speed.get(metric)]))
    for metric, key in EXACTNESS.items() if exact else ():
        add(metric, exact.get(key, None if key == "rate" else 0))
    for c, part in (speed.get("by_category") or {}).items():
        add("speedup_side_by_side", *side_by_side(part), category=c)
        add("tokens_per_s", part["tokens_per_s"], category=c)
        add("tau", part.get("tau"), category=c)
    quality = {k: v for k, v in summary.items() if k not in ("task", "samples") and isinstance(v, int | float)}
    bounds = {f"{k}{s}" for k in quality for s in ("_low", "_high")}
    for k, v in quality.items():
        if k not in bounds:
            add(f"q:{k}", v, quality.get(f"{k}_low"), quality.get(f"{k}_high"), unstable=False)
    return out


def collect(results: Path, reported: dict[str, Any] | None = None) -> Collected:
    """Every figure of the grid's finished cells (those with a ``.speed.json``); ``reported``: the paper's
    figures (default: config/paper_reported.yaml)."""
    results = Path(results)
    records, rows, speeds, samples, policy, read = [], [], {}, {}, Policy(), {}
    for dims in grid_dims(results):
        base = cell_path(results, dims["id"])
        if not beside(base, "speed").exists():
            continue
        speed = speeds[dims["id"]] = speed_record(beside(base, "speed"))
        policy = Policy.from_dict(speed.get("policy"))  # the cells' own: one config judged them all
        samples[dims["id"]] = read_jsonl(base, links=False)
        summary = beside(base, "summary")
        quality = _record(summary, "score summary", "the score summary") if summary.exists() else {}
        read[dims["id"]] = {"speed": speed, "quality": quality}
        rows += cell_figures(dims["id"], speed, quality)
        record = {k: v for k, v in dims.items() if k != "models"} | {"models": " + ".join(dims["models"])}
        if dims.get("control") == "null":  # the run's own control, a row of its own in every table (grid.null_cell)
            record |= {"method": NULL_LABEL.format(method=dims["method"]), "kind": "null"}
        records.append(record | {"unstable": bool(speed.get("unstable")), "flags": "; ".join(speed.get("flags", []))})
    cells = pd.DataFrame.from_records(records)
    if not cells.empty:
        cells["gamma"] = cells["gamma"].fillna("")
        cells["T"] = cells["temperature"].map(lambda t: f"{t:g}")
        rows += ratios(cells, rows, samples, policy) + over_peers(cells, samples, speeds)
        rows += across_engines(cells, samples, speeds)
    figures = pd.DataFrame(rows, columns=FIGURE, dtype=object).astype({"low": float, "high": float, "unstable": bool})
    reported = load_reported() if reported is None else reported
    named = reported.get("experiment") in set(cells.get("experiment", []))
    scores = scored(cells, results)
    reported = reported if named else None
    derived = set(cells["id"][cells["samples_from"].notna()]) if "samples_from" in cells else set()
    beside_ = beside_runs({c: s for c, s in speeds.items() if c not in derived})  # their runs are their sources'
    control = null_control(cells, figures, policy.confidence)
    return Collected(cells, figures, scores, policy.confidence, reported, drafts(results), beside_, read, control)


BESIDE = ["cell", "process", "pairs", "interfered", "cpu_s"]


def beside_runs(speeds: dict[str, dict[str, Any]]) -> pd.DataFrame:
    """What took CPU time beside each cell's timed pairs (``.speed.json``'s ``beside``, ``speed.beside_pairs``):
    one row per cell and process; ``process`` ``""``: every timed pair of the cell."""
    rows = []
    for cell, speed in speeds.items():
        if "beside" not in speed:
            continue
        rows.append([cell, "", speed.get("samples", 0), speed.get("pairs_interfered", 0), 0.0])
        rows += [[cell, p, v["pairs"], v["interfered"], v["cpu_s"]] for p, v in speed["beside"].items()]
    return pd.DataFrame(rows, columns=BESIDE)


DRAFT_FACTS = (  # a distilled model's record (``models/<name>.json``, ``distilled``) -> the drafts table's columns
    "teacher loss steps agreement agreement_with_lookup acceptance_t1 acceptance_t1_with_lookup agreement_prefix "
    "eval_tokens eval_positions final_loss threads train_seconds total_seconds"
).split()


def drafts(results: Path) -> pd.DataFrame:
    """One row per distilled model or feature head prepared for the grid (``models/*.json``: ``distilled``,
    ``feature_head``)."""
    rows = []
    for path in sorted(Results(results).models.glob("*.json")):
        try:
            record = read_record(path, "model record")
            made = [(path.stem, record.get("distilled")), (f"{path.stem} (eagle)", record.get("feature_head"))]
        except UserError:
            continue  # not a model record: the preparation's own files are checked where they are written
        for name, facts in made:
            if isinstance(facts, dict):
                facts = {**facts, "loss": (facts.get("recipe") or {}).get("loss", "ce")}
                rows.append(
                    {"model": name, "kind": facts.get("kind", "draft")} | {k: facts.get(k) for k in DRAFT_FACTS}
                )
    return pd.DataFrame.from_records(rows, columns=["model", "kind", *DRAFT_FACTS])


def ratios(cells: pd.DataFrame, rows: list[tuple], samples: dict[str, list], policy: Policy) -> list[tuple]:
    """Speed-ups over the standard method (side by side when measured) and over the large model's own cell. A
    ratio across cells (prompts paired by id) is unstable when either cell is, or when its interval is too wide."""
    key = ["dataset", "temperature"]
    large = cells[cells["method"] == "large_model"].set_index([*key, "model_set"])["id"]
    plain = cells[cells["kind"] == "plain"].set_index([*key, "model_set", "method"])["id"]
    unstable = cells.set_index("id")["unstable"]
    side_by_side = {f[0]: f[3:6] for f in rows if f[1] == "speedup_side_by_side" and not f[2]}

    def across(r, ref):  # the cell's speed over another cell's on the prompts both ran (paired by id)
        if not isinstance(ref, str):
            return None
        other = {x["id"]: x["stats"] for x in samples[ref]}
        found = paired_speedup([(x["stats"], other[x["id"]]) for x in samples[r["id"]] if x["id"] in other], policy)
        if found is None:
            return None
        hw = halfwidth(*found[:3])
        return (*found[:3], bool(r["unstable"] or unstable[ref] or (hw is not None and hw > policy.max_halfwidth)))

    def vs_large(r):
        return across(r, large.get((r["dataset"], r["temperature"], r["large_model"])))

    def vs_standard(r):
        if not isinstance(r["standard"], str):
            return None
        if r["kind"] == "plain":
            return 1.0, None, None, bool(r["unstable"])  # an ensemble is its own standard
        if r["id"] in side_by_side:
            return (*side_by_side[r["id"]], bool(r["unstable"]))
        if r["standard"] == "large_model":
            return vs_large(r)
        return across(r, plain.get((r["dataset"], r["temperature"], r["model_set"], r["standard"])))

    found = [
        (name, r["id"], fn(r))
        for name, fn in (("speedup_vs_large", vs_large), ("speedup_vs_standard", vs_standard))
        for _, r in cells.iterrows()
    ]
    return [(cell, name, "", *v) for name, cell, v in found if v is not None]


def over_peers(cells: pd.DataFrame, samples: dict[str, list], speeds: dict[str, dict]) -> list[tuple]:
    """Ours over other engines' methods (transformers' ``hf_*``, vLLM's ``vllm_*``; the category): each
    speculative cell of ours against each peer cell of the same model set, dataset and T, as the ratio of their
    side-by-side speed-ups (each over its own engine's standard method)."""
    peers, ours = cells[cells["kind"].isin(PEER_KINDS)], cells[cells["kind"].isin(["sd", "se"])]
    out, key = [], ["model_set", "dataset", "temperature"]
    for _, p in peers.iterrows():
        policy = Policy.from_dict(speeds[p["id"]].get("policy"))
        for _, o in ours[(ours[key] == p[key]).all(axis=1)].iterrows():
            if (ratio := relative_speedup(samples[o["id"]], samples[p["id"]], policy)) is not None:
                peer, unstable = peer_label(p), bool(o["unstable"] or p["unstable"])
                out.append((o["id"], "speedup_vs_peer", peer, *ratio, unstable))
    return out


def peer_label(peer: pd.Series) -> str:
    """A peer cell as the tables name it: its method and gamma, and ``not exact`` where its samples do not follow
    its standard method's distribution (``spec.NOT_EXACT_SAMPLING``)."""
    exact = parse_method(peer["method"]).exact_at(float(peer["temperature"]))
    return f"{peer['method']} (γ={peer['gamma']}{'' if exact else ', not exact'})"


def across_engines(cells: pd.DataFrame, samples: dict[str, list], speeds: dict[str, dict]) -> list[tuple]:
    """Ours against vLLM in tokens/s, across jobs (the category: ``ours / vLLM's``): each ``sd`` cell of ours over
    each vLLM speculation cell of the same model set, dataset and T, and the large model by our decoder (its runs
    beside ``sd``) over vLLM's decoding of it (its runs beside vLLM's speculation). Different jobs, so not side by
    side: whatever else the machine did between them is in these ratios; the interval is over prompts only."""
    peers = cells[cells["kind"].isin(PEER_KINDS)]  # another engine's speculation (a null cell's method is a label)
    own = [parse_method(m).engine.standard for m in peers["method"]]  # None: it decodes our standard methods
    theirs, ours = peers.assign(standard=own).dropna(subset=["standard"]), cells[cells["method"] == "sd"]
    out, key, baselines = [], ["model_set", "dataset", "temperature"], set()
    for _, t in theirs.iterrows():
        policy = Policy.from_dict(speeds[t["id"]].get("policy"))
        for _, o in ours[(ours[key] == t[key]).all(axis=1)].iterrows():
            unstable = bool(o["unstable"] or t["unstable"])
            pairs = [("method", "method", f"sd (γ={o['gamma']}) / {peer_label(t)}")]
            if o["id"] not in baselines:  # the two engines' decoding of the large model, once per cell of ours
                baselines.add(o["id"])
                pairs.append(("baseline", "baseline", f"large_model / {t['standard']}"))
            for side_o, side_t, category in pairs:
                if (ratio := engine_ratio(samples[o["id"]], side_o, samples[t["id"]], side_t, policy)) is not None:
                    out.append((o["id"], "tokens_per_s_vs_vllm", category, *ratio, unstable))
    return out


def engine_ratio(
    rows_a: list[dict], side_a: str, rows_b: list[dict], side_b: str, policy: Policy
) -> tuple[float, float | None, float | None] | None:
    """Tokens/s of cell a's ``side_a`` runs (``method`` or ``baseline``) over cell b's ``side_b`` runs, prompts
    paired by id, with its interval over prompts (None without common prompts)."""

    def run(r: dict, side: str) -> dict | None:
        return r if side == "method" else r.get("baseline")

    b = {r["id"]: run(r, side_b) for r in rows_b}
    pairs = [(run(r, side_a), b[r["id"]]) for r in rows_a if b.get(r["id"]) and run(r, side_a)]
    if not pairs:
        return None
    series = [[(x["stats"]["new_tokens"], x["stats"]["wall_time_s"]) for x in side] for side in zip(*pairs)]
    ones = [(1, 1.0)] * len(pairs)  # a ratio of ratios over a constant: the plain ratio of tokens/s
    return speedup_ratio(series[0], ones, series[1], ones, policy)


def scored(cells: pd.DataFrame, results: Path) -> pd.DataFrame:
    """The log-likelihood figures (``likelihood/<task>.json``) of each distribution the grid's cells draw from,
    with the methods that share it and its first cell's place (the rows follow the grid); an ensemble's figures
    minus its large model's on the same questions (``<task> <metric> - large``) with a paired bootstrap interval."""
    order: dict[str, int] = {}  # each method of a set by its first cell
    for i, use in enumerate(f"{m} ({s})" for m, s in zip(cells.get("method", []), cells.get("model_set", []))):
        order.setdefault(use, i)
    rows = []
    for path in sorted(Results(results).likelihoods.glob("*.json")):
        found = _record(path, "likelihood record", "the likelihood record")
        for key, score in found["scores"].items():
            uses = sorted((u for u in score.get("uses", []) if u in order), key=order.get)
            if not uses:
                continue  # a distribution of another config's grid
            head, task = (key, "; ".join(uses), order[uses[0]]), found["task"]
            for metric, f in score["metrics"].items():
                rows.append((*head, f"{task} {metric} (n={found['questions']})", f["value"], f["low"], f["high"]))
            ref = found["scores"].get(score.get("models", [key])[0])
            for metric, values in score["per_question"].items() if ref is not None and ref is not score else ():
                diff = [a - b for a, b in zip(values, ref["per_question"][metric])]
                rows.append((*head, f"{task} {metric} - large", sum(diff) / len(diff), *bootstrap_interval(diff)))
    return pd.DataFrame(rows, columns=["distribution", "methods", "first", "metric", "value", "low", "high"])


def joined(values) -> str | None:
    """Per-model or per-position figures as one text: ``2.50 1.25``, ``-`` for a missing one."""
    return " ".join("-" if v is None else f"{v:.2f}" for v in values) if values else None


def parts(found: Collected) -> dict[str, dict[tuple[str, str], Any]]:
    """cell -> (metric, category) -> its figure."""
    out: dict[str, dict[tuple[str, str], Any]] = {cell: {} for cell in found.cells.get("id", [])}
    for f in found.figures.itertuples(index=False):
        out[f.cell][(f.metric, f.category)] = f
    return out


def per_cell(found: Collected, metrics) -> pd.DataFrame:
    """The cells' rows with each of ``metrics`` (its whole-cell figure) as columns: ``<metric>``, its interval
    (``_low``, ``_high``) where the metric has one, a ratio's ``_unstable``; a list's figures joined in one text."""
    bounded = {*RATIOS, "speedup_side_by_side", *found.figures["metric"][found.figures["low"].notna()]}
    records = []
    for mine in parts(found).values():
        record = {}
        for m, f in ((m, mine.get((m, ""))) for m in metrics):
            record[m] = joined([g.value for (n, _), g in mine.items() if n == m]) if m in LISTS else f and f.value
            record |= {f"{m}_low": f and f.low, f"{m}_high": f and f.high} if m in bounded else {}
            record |= {f"{m}_unstable": bool(f and f.unstable)} if m in RATIOS else {}
        records.append(record)
    wide = pd.DataFrame.from_records(records, index=found.cells.index)
    floats = [c for c in wide.columns if c in RATIOS or c.endswith(("_low", "_high"))]
    return pd.concat([found.cells, wide.astype(dict.fromkeys(floats, float))], axis=1)
