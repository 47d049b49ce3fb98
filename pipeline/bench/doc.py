"""docs/benchmarks.md from the benchmark records (benchmarks/*.json, benchmarks/runners/*.json) and what each one
is (benchmarks/notes.yaml), so a figure on that page cannot drift from the run that produced it (a test
regenerates the page and compares).

    python -m pipeline.bench.doc            # rewrite docs/benchmarks.md
    python -m pipeline.bench.doc --check    # exit 1 when docs/benchmarks.md is not what the records give
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import yaml

from pipeline.errors import UserError, one_line
from pipeline.files import generated_page, read_user_json
from pipeline.measure.speed import fmt

from .. import ROOT

RECORDS = ROOT / "benchmarks"
NOTES = RECORDS / "notes.yaml"
PAGE = ROOT / "docs" / "benchmarks.md"

HEADER = """# Benchmark records

Generated from the records under `benchmarks/` and their descriptions in `benchmarks/notes.yaml` by
`python -m pipeline.bench.doc`; edit those, not this file (`tests/test_docs.py` checks they agree).

Each run of `python -m pipeline.bench` (`make bench`) is recorded as `benchmarks/<UTC time>-<commit>.json`: the
machine, the settings, every row it printed and every per-prompt time, and whether the tree was dirty; each run
of `python -m pipeline.bench.runners` that is kept lies under `benchmarks/runners/`. How the figures are measured
is in [speed.md](speed.md); the GPU figures are in [cluster.md](cluster.md#the-h100-figures).

Columns of a benchmark table: tok/s is total new tokens over total wall time of the prompts; speed-up is over
the group's baseline (its first row), measured interleaved, with its 95% interval over the prompts (a paired
bootstrap in the records before 2026-12-05, Student's t since: speed.md); accept is accepted over verified
proposals, prompt lookup's included; τ is tokens per target forward,
the verifier's token included; overhead is 1 − time inside model forwards / wall time (negative for a parallel
method, whose forwards overlap); predicted is the speed-up the counted forwards and measured one-token costs
predict; same is the greedy outputs identical to the baseline's; `dyn` rows start a dynamic gamma at the
gamma named and give their speed over the best fixed gamma of their method; a transformers method (`hf_*`)
gives ours (`sd`, `we_sd` for the ensemble) over it at the same gamma.
"""


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def _num(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _interval(value: float | None, ci: list[float] | None) -> str:
    return fmt(value, *(ci or (None, None)))


def _against(row: dict[str, Any]) -> str:
    """What a row is set against beyond its baseline: the best fixed gamma, or transformers' method."""
    best = row.get("vs_best_fixed")
    if best:
        return f"over `{best['fixed']}`: {_interval(best['ratio'], best['ci'])}"
    if row.get("ours_vs_hf") is not None:
        return f"ours over it: {_interval(row['ours_vs_hf'], row.get('ours_vs_hf_ci'))}"
    return ""


def bench_table(record: dict[str, Any]) -> list[str]:
    rows = record["rows"]
    predicted = any(r.get("predicted") is not None for r in rows)
    against = any(_against(r) for r in rows)
    head = ["group", "method", "tok/s", "speed-up [95% interval]", "accept", "τ", "overhead"]
    head += ["predicted"] * predicted + ["same"] + ["against"] * against
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        speedup = "1.00x" if r["speedup"] == 1.0 else _interval(r["speedup"], r["speedup_ci"])
        cells = [r["group"], f"`{r['method']}`", _num(r["tok_per_s"], 1), speedup, _pct(r["acceptance"])]
        cells += [_num(r["tau"]), _pct(r["overhead"])]
        cells += [fmt(r.get("predicted"))] * predicted + [str(r["identical"])] + [_against(r)] * against
        lines.append("| " + " | ".join(cells) + " |")
    best = record["settings"].get("best_against_best")
    if best:
        lines += [
            "",
            f"Best against best, each over its own baseline: `{best['ours']}` over `{best['peer']}`: "
            f"{_interval(best['ratio'], best['ratio_ci'])}.",
        ]
    return lines


def runners_table(record: dict[str, Any]) -> list[str]:
    rows = record["runners"] if "runners" in record else record["engines"]  # the records of before the rename
    runner = "runner" if "runners" in record else "engine"
    ks = sorted({int(k) for e in rows for k in e["ms_per_forward"]} - {1})
    first = rows[0][runner]
    head = ["shape", "runner", "tok/s (bound)", "ms, 1 token", f"k = {' / '.join(map(str, ks))} over 1"]
    head += [f"tok/s over {first}", f"1-token forward over {first}"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for e in rows:
        ms = e["ms_per_forward"]
        ratios = " / ".join(f"{ms[str(k)] / ms['1']:.2f}" for k in ks)
        speed, forward = (fmt(*(e.get(key) or [None])) for key in ("speedup", "forward_speedup"))
        cells = [e["shape"], f"`{e[runner]}`", f"{e['tokens_per_s']:.1f} ({e['bound_tokens_per_s']:.1f})"]
        cells += [f"{ms['1']:.2f}", ratios, "" if speed == "-" else speed, "" if forward == "-" else forward]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def machine_line(record: dict[str, Any]) -> str:
    if "rows" in record:
        m = record["machine"]
        dirty = ", uncommitted changes" if record["dirty"] else ""
        return (
            f"Commit `{record['commit']}`{dirty}, {record['time']}; {m['device']}, {m['threads']} thread(s), "
            f"{m['engine']}."
        )
    return (
        f"{record['device']}, {record['threads']} thread(s), torch {record['torch']}; measured copy bandwidth "
        f"{record['bandwidth_gb_s']:.1f} GB/s."
    )


def settings_line(record: dict[str, Any]) -> str:
    if "rows" not in record:
        return ""
    s = record["settings"]
    gamma = " ".join(map(str, s["gamma"]))
    proposer = " / ".join(s["proposer"]) if isinstance(s["proposer"], list) else s["proposer"]  # a sweep: several
    return (
        f"{s['prompts']} HumanEval prompts × {s['max_new_tokens']} new tokens, γ ∈ {{{gamma}}}, draft "
        f"{s['draft']}, proposer `{proposer}`, kernels: {s.get('kernels', 'default')}."
    )


def records() -> list[Path]:
    return sorted(RECORDS.glob("*.json")) + sorted((RECORDS / "runners").glob("*.json"))


def load_notes() -> dict[str, dict[str, str]]:
    try:
        notes = yaml.safe_load(NOTES.read_text())["records"]
    except (OSError, yaml.YAMLError, KeyError, TypeError) as exc:
        raise UserError(f"{NOTES}: {one_line(exc)}") from exc
    names = {p.relative_to(RECORDS).as_posix() for p in records()}
    missing, extra = sorted(names - set(notes)), sorted(set(notes) - names)
    if missing or extra:
        raise UserError(
            f"{NOTES}: records without a note: {missing or 'none'}; notes without a record: {extra or 'none'}"
        )
    return notes


def render_page() -> str:
    notes = load_notes()
    lines = [HEADER.rstrip("\n")]
    for path in records():
        name = path.relative_to(RECORDS).as_posix()
        record, note = read_user_json(path, "bench record"), notes[name]
        lines += ["", f"## {note['title']}", "", f"`benchmarks/{name}`. {machine_line(record)}"]
        settings = settings_line(record)
        if settings:
            lines[-1] += " " + settings
        lines += ["", "```bash", note["command"].strip(), "```", ""]
        lines += bench_table(record) if "rows" in record else runners_table(record)
        lines += ["", note["note"].strip()]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    return generated_page(argv, "pipeline.bench.doc", __doc__, PAGE, "the records", render_page)


if __name__ == "__main__":
    sys.exit(main())
