"""The product path on a GPU: ``pipeline generate`` on grid cells of random-weight models, per runner.

Random-weight Llama models of two shapes (a target and a draft, the bundled
model's tokenizer and vocabulary) are saved as local model directories; grid
cells (Spec-Bench prompts from a local data directory, T = 0, side by side with
the standard method) run through ``run_cell``, the generation job itself, once
per runner. Printed per cell: the side-by-side speed-up with its interval, τ,
flags, and exactness (the method's tokens against its baseline's, which must be
identical at T = 0). Random weights make acceptance low: these are cost and
correctness figures, not speed-ups a trained pair would reach.

    python benchmarks/gpu/product_path.py --prepare .gpu-carry      # here: tokenizer and prompts to carry
    python benchmarks/gpu/product_path.py --carry .gpu-carry --out $OUT/product --device cuda
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from pipeline.bench.runners import build  # noqa: E402

# (method, baseline, method arguments, gamma); we_p runs the members' forwards on their own CUDA streams
METHODS = [
    ("sd", "large_model", {}, 3),
    ("we_sd", "we", {"lambda": 0.5}, 3),
    ("we_se", "we", {"lambda": 0.5}, [1, 3]),
    ("we_p", "we", {"lambda": 0.5}, 1),
]
# a runner row on accelerate's device_map="auto" (one GPU: all of it on cuda:0)
DEVICES = {"eager+auto": ("eager", "auto")}


def prepare(carry: Path, data_dir: Path) -> None:
    """Copy what the GPU machine lacks: the bundled model's tokenizer and the Spec-Bench questions."""
    from pipeline.models import bundled_dir

    carry.mkdir(parents=True, exist_ok=True)
    tok = carry / "tokenizer"
    tok.mkdir(exist_ok=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if (bundled_dir() / name).exists():
            shutil.copy(bundled_dir() / name, tok / name)
    (carry / "data" / "spec_bench").mkdir(parents=True, exist_ok=True)
    shutil.copy(data_dir / "spec_bench" / "question.jsonl", carry / "data" / "spec_bench" / "question.jsonl")
    print(f"prepared {carry}")


def save_model(shape: str, tokenizer, out: Path, dtype: torch.dtype, device: str) -> Path:
    """A random-weight model of ``shape`` with the tokenizer's vocabulary, saved as a model directory."""
    model = build(shape, dtype, device, vocab=len(tokenizer))
    model.config.eos_token_id = tokenizer.eos_token_id
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prepare", type=Path, help="write the carry directory here and stop")
    ap.add_argument("--data-dir", type=Path, default=ROOT.parent / "shared" / "data")
    ap.add_argument("--carry", type=Path, default=ROOT / ".gpu-carry")
    ap.add_argument("--out", type=Path, required=False, default=Path("/tmp/product-path"))
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--target", default="llama-1b")
    ap.add_argument("--draft", default="llama-68m")
    ap.add_argument("--runners", nargs="+", default=["eager", "compiled", "eager+auto"])
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    args = ap.parse_args(argv)
    if args.prepare:
        prepare(args.prepare, args.data_dir)
        return 0
    from transformers import AutoTokenizer

    from pipeline.experiment.cell import Cell
    from pipeline.job.generate import run_cell

    dtype = getattr(torch, args.dtype)
    tokenizer = AutoTokenizer.from_pretrained(args.carry / "tokenizer")
    models = args.out / "models"
    dirs = {
        f"{role}-{s}": save_model(s, tokenizer, models / role, dtype, args.device)
        for role, s in (("target", args.target), ("draft", args.draft))
    }
    results = []
    for row in args.runners:
        runner, device = DEVICES.get(row, (row, args.device))
        specs = [
            {"name": s, "source": str(d), "dtype": args.dtype, "device": device, "runner": runner}
            for s, d in dirs.items()
        ]
        for method, baseline, margs, gamma in METHODS:
            cell = {
                "models": specs,
                "method": method,
                "task": "spec_bench",
                "gamma": gamma,
                "size": args.prompts,
                "data_dir": str(args.carry / "data"),
                "max_new_tokens": args.max_new_tokens,
                "temperature": 0.0,
                "method_args": {**margs, **({} if method.endswith("_p") else {"proposer": "draft"})},
                "baseline": baseline,
                "baseline_args": margs,
            }
            out = args.out / row / f"{method}.jsonl"
            start = time.perf_counter()
            summary = run_cell(Cell.from_json(cell), out, progress=False)
            rows = [json.loads(line) for line in out.read_text().splitlines()]
            exact = sum(r["token_ids"] == r["baseline"]["token_ids"] for r in rows)
            results.append(
                {
                    "runner": row,
                    "method": method,
                    "summary": summary,
                    "exact": [exact, len(rows)],
                    "seconds": time.perf_counter() - start,
                }
            )
            s = summary or {}
            ci = f"[{s.get('speedup_ci_low') or float('nan'):.2f}, {s.get('speedup_ci_high') or float('nan'):.2f}]"
            print(
                f"{row:9} {method:6} vs {baseline:11} {s.get('speedup_side_by_side') or float('nan'):.2f}x {ci} "
                f"tok/s {s.get('tokens_per_s') or float('nan'):.1f} "
                f"(baseline {s.get('baseline_tokens_per_s') or float('nan'):.1f}) "
                f"tau {s.get('tau')} flags {s.get('flags')} "
                f"exact {exact}/{len(rows)} ({time.perf_counter() - start:.0f} s)",
                flush=True,
            )
            (args.out / "product_path.json").write_text(json.dumps(results, indent=2, default=str))  # kept if cut short
    return 0


if __name__ == "__main__":
    sys.exit(main())
