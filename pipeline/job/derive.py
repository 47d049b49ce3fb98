"""A standard method's cell made from the runs another cell already made of it (docs/workflow.md, rule ``derive``).

With ``side_by_side`` on, a speculative cell runs its standard method beside each sample: the same models, prompts,
seeds and settings as that method's own cell in the grid (``grid.derived_cells`` pairs them). Running the standard
cell again would repeat those runs token for token, so its samples are taken from the source cell's ``baseline``
records instead, each with the timing of its own run (the counted attempt's ``baseline`` region, now the cell's
``method``) and the source cell's provenance. The tokens are the ones the standard cell's own job would make (a
test generates both and compares them); the speed is that of runs interleaved with another method's, as every
side-by-side baseline's is.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tasks import get_task

from ..errors import UserError
from ..experiment.cell import CellFile
from ..experiment.grid import OWN_SETTINGS
from ..experiment.paths import beside
from ..files import ResultsError, read_jsonl, read_user_json, write_atomic

CARRIED = ("id", "prompt_ids", "category", "provenance", "run")  # a source row's fields that are the sample's too


def derived_row(row: dict[str, Any], source: str) -> dict[str, Any]:
    """The standard method's sample in a source cell's ``row``: its baseline record, timed by its own regions."""
    base = row.get("baseline")
    if not isinstance(base, dict) or not {"output", "token_ids", "stats"} <= set(base):
        raise UserError(f"cell {source}: sample {row.get('id')!r} has no baseline record to take a sample from")
    out = {k: row[k] for k in CARRIED if k in row}
    out.update({k: base[k] for k in ("output", "token_ids", "stats", "pieces") if k in base})
    if "timing" in row:
        timing = row["timing"]
        attempts = timing.get("attempts") if isinstance(timing, dict) else None
        regions = [a.get("baseline") if isinstance(a, dict) else None for a in attempts or []]
        counted = timing.get("counted") if isinstance(timing, dict) else None
        if (
            not regions
            or not all(isinstance(r, dict) and "interfered" in r for r in regions)
            or not (isinstance(counted, int) and not isinstance(counted, bool) and 0 <= counted < len(regions))
        ):
            raise UserError(
                f"cell {source}: sample {row.get('id')!r} has a damaged timing record (expected attempts with a "
                "baseline region each and a counted attempt among them); generate that cell again"
            )
        out["timing"] = {
            "attempts": [{"interfered": r["interfered"], "method": r} for r in regions],
            "counted": counted,
        }
    out["samples_from"] = source
    return out


def prompt_ids(cell) -> list[str]:
    """The ids of the prompts ``cell`` runs, in its order (as its own generation job loads them)."""
    return [ex.id for ex in get_task(cell.task).load(cell.size, cell.data_dir, cell.seed)]


def in_prompt_order(rows: list[dict[str, Any]], ids: list[str], source: str, cell: str) -> list[dict[str, Any]]:
    """``rows`` in the order of ``ids``, when they are exactly the cell's prompts, each once; else a one-line error
    naming the first id missing, repeated or foreign (a derived cell is its own job's output or nothing)."""
    seen: dict[Any, dict[str, Any]] = {}
    for row in rows:
        if row.get("id") in seen:
            raise UserError(f"cell {source} holds prompt {row.get('id')!r} twice; cell {cell} takes each prompt once")
        seen[row.get("id")] = row
    if foreign := [i for i in seen if i not in set(ids)]:
        raise UserError(f"cell {source} holds prompt {foreign[0]!r}, which cell {cell} does not run")
    if missing := [i for i in ids if i not in seen]:
        raise UserError(f"cell {source} lacks prompt {missing[0]!r} of cell {cell} ({len(missing)} missing)")
    return [seen[i] for i in ids]


def derive_cell(cell_file: Path, source_samples: Path, out: Path) -> int:
    """Write the cell ``cell_file``'s samples (``out``) and meta from the source cell's finished samples; returns
    how many. The cell file's dims name the source (``samples_from``); its method must be the source's baseline."""
    entry = CellFile.read(cell_file)
    source = entry.dims.samples_from if entry.dims else None
    if source is None:
        raise UserError(f"cell file {cell_file}: its dims name no samples_from cell to derive its samples from")
    source_meta = read_user_json(beside(source_samples, "meta"), f"cell {source}'s meta file", links=False)
    ran = source_meta.get("cell") if isinstance(source_meta, dict) else None
    if not isinstance(ran, dict) or "environment" not in source_meta:
        raise UserError(f"{beside(source_samples, 'meta')}: not a generation job's meta file (no cell or environment)")
    if (ran.get("baseline"), ran.get("baseline_args", {})) != (entry.cell.method, entry.cell.method_args):
        raise UserError(
            f"cell {source} runs {ran.get('baseline')!r} with {ran.get('baseline_args', {})} beside its samples, "
            f"not {entry.cell.method!r} with {entry.cell.method_args}"
        )
    mine = {k: v for k, v in entry.cell.described().items() if k not in OWN_SETTINGS}
    missing = sorted(k for k in mine if k not in ran)  # a setting its meta does not record is not known to match
    if missing:
        raise UserError(
            f"cell {source}'s meta file does not record its {', '.join(missing)}: cannot derive cell {entry.dims.id}"
        )
    if differ := sorted(k for k, v in mine.items() if ran[k] != v):
        raise UserError(f"cell {source} ran with other {', '.join(differ)} than cell {entry.dims.id}")
    rows = [derived_row(r, source) for r in read_jsonl(source_samples, links=False)]
    rows = in_prompt_order(rows, prompt_ids(entry.cell), source, entry.dims.id)
    meta = {"environment": source_meta["environment"], "cell": entry.cell.described(), "samples_from": source}
    written = [(Path(out), "".join(json.dumps(r) + "\n" for r in rows))]  # the samples first, the meta after them
    written.append((beside(out, "meta"), json.dumps(meta, indent=2, default=str) + "\n"))
    try:
        for path, text in written:
            write_atomic(path, text)
    except OSError as err:  # a full disk, a quota: neither file is left, so no meta stands without its samples
        for path, _ in written:
            path.unlink(missing_ok=True)
        raise ResultsError(
            f"cannot write cell {entry.dims.id}'s samples beside {out.parent}: {err.strerror or err}; nothing of it "
            "was kept (free some space, run again)"
        ) from None
    return len(rows)
