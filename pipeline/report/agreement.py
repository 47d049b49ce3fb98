"""vLLM's greedy tokens against ours, token for token: ``python -m pipeline.report.agreement RESULTS``.

For each greedy ``vllm`` cell of a results directory and our ``large_model`` cell of the same model, dataset and
prompts, the two outputs are compared sample by sample; each difference is checked in float64 at its first
position as our own greedy mismatches are (``job/exactness.py``): a near-tie (numerics: the two engines' float32
kernels round differently) or a bug. Prints one line per pair of cells (docs/vllm.md, "Exactness").
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from ..decoding.spec import STANDARDS
from ..errors import UserError
from ..experiment.cell import GRID
from ..experiment.paths import Results, cell_path
from ..files import read_jsonl
from ..records import read_record


def greedy_pairs(results: Path) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(vLLM's cell, our large_model cell) of the same first model, dataset and seed, both at T = 0."""
    index = Results(results).grid
    if not index.is_file():
        raise UserError(f"{results}: no grid.json (not a results directory, or no cells written yet)")
    cells = read_record(index, GRID, "the grid index")
    greedy = [c for c in cells if c.get("temperature") == 0 and not c.get("control")]
    ours = {(c["models"][0], c["dataset"]): c for c in greedy if c["method"] == "large_model"}
    theirs = [c for c in greedy if c["method"] in STANDARDS]  # an engine's own decoding (vLLM's ``vllm``)
    return [(c, ours[key]) for c in theirs if (key := (c["models"][0], c["dataset"])) in ours]


def agreement(results: Path, theirs: dict[str, Any], ours: dict[str, Any], near_tie_nats: float = 0.1) -> dict:
    """The exactness record of vLLM's samples against ours (``exactness.check``), on the prompts both have."""
    from ..experiment.cell import CellFile
    from ..job.exactness import check

    rows_ours = {r["id"]: r for r in read_jsonl(cell_path(results, ours["id"]), links=False)}
    rows = [
        {"id": r["id"], "token_ids": r["token_ids"], "baseline": rows_ours[r["id"]]}
        for r in read_jsonl(cell_path(results, theirs["id"]), links=False)
        if r["id"] in rows_ours
    ]
    prompts = {r["id"]: rows_ours[r["id"]]["prompt_ids"] for r in rows}  # the same prompts: ours carry them
    specs = CellFile.read(Results(results).cell_file(ours["id"])).cell.models
    return check(rows, prompts, specs, STANDARDS[theirs["method"]].reference, {}, near_tie_nats)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipeline.report.agreement", description=__doc__.split("\n")[0])
    parser.add_argument("results", type=Path, help="a results directory with greedy vllm and large_model cells")
    args = parser.parse_args(argv)
    try:
        pairs = greedy_pairs(args.results)
        if not pairs:
            raise UserError(f"{args.results}: no greedy vllm cell beside a greedy large_model cell of its model")
        for theirs, ours in pairs:
            r = agreement(args.results, theirs, ours)
            said = f"{r['identical']} of {r['compared']} samples identical"
            if r["mismatches"]:
                said += f"; {r.get('numerics', 0)} part at a near-tie, {r.get('bugs', 0)} do not"
                said += f", {r.get('unchecked', 0)} unchecked"
            print(f"{theirs['id']} against {ours['id']}: {said}")
    except UserError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
