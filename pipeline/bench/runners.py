"""What a forward costs on this machine, per runner: the numbers a speed-up is made of.

For each model shape (the bundled model, ``draft``: its distilled 2-layer
draft, or random-weight Llama shapes of about 68M, 1B and 7B parameters:
cost does not depend on the weights) and each runner, it measures:

* the memory bandwidth (a large device-to-device copy) and the bound it sets:
  tokens/s <= bandwidth / bytes of weights, since every token reads them all;
* tokens/s of plain autoregressive decoding at batch size 1 (``generate``,
  ``large_model``), against that bound;
* the cost of one forward of k new tokens over a context, k = 1..8, as a
  ratio to k = 1 (speculative verification runs k = γ+1; the cost model of
  the speculative-ensemble paper assumes the ratio is 1);
* with ``--pairs``: ``sd`` against ``large_model`` for a draft whose
  acceptance is set by construction (it costs what its own shape costs and
  proposes the target's next greedy token with probability ``a``), beside
  the speed-up the measured costs predict (Leviathan et al. 2023:
  E[tokens per round] = (1 - a^(γ+1)) / (1 - a) over a round costing
  γ·c_draft(1) + c_target(γ+1)), and the decoder's own time per round (wall
  time outside model forwards).

The runners of one shape are all built and compiled first, then measured in
interleaved rounds (``forward_timing.interleaved``); each runner after the
first gets its speed-up over the first (tokens/s and a one-token forward) with
a 95% paired-bootstrap interval over rounds.

Runners: the decoder's (``eager``, ``compiled``, ``compiled+autotune``:
``runner.set_runner``), ``eager+pack`` (oneDNN prepacked linears, CPU) and
``compiled+freeze`` (inductor with weight freezing, which also prepacks on a CPU).

    python -m pipeline.bench.runners --shapes bundled --dtype float32 bfloat16 \\
        --runners eager eager+pack compiled compiled+freeze
    python -m pipeline.bench.runners --device cuda --shapes llama-68m llama-1b llama-7b \\
        --dtype bfloat16 --runners eager compiled --pairs llama-7b:llama-68m
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from itertools import product
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..decoding import generate
from ..decoding.runner import RUNNERS, set_runner
from ..files import write_atomic
from ..measure.cost import chain_speedup
from ..measure.forward_timing import Contender, compiling, interleaved
from ..measure.speed import fmt as speed_fmt
from ..measure.speed import series_speedup

SHAPES = {  # Llama-shaped: hidden, layers, heads, kv heads, intermediate, vocabulary
    "tiny": (64, 2, 4, 2, 128, 512),
    "llama-68m": (768, 2, 12, 12, 3072, 32000),  # the speculative-ensemble paper's draft size
    "llama-1b": (2048, 22, 32, 4, 5632, 32000),
    "llama-7b": (4096, 32, 32, 32, 11008, 32000),
}
BENCH_RUNNERS = ("eager", "eager+pack", "compiled", "compiled+freeze", "compiled+autotune")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def build(shape: str, dtype: torch.dtype, device: str, vocab: int | None = None) -> nn.Module:
    """The bundled model or its draft, or a random-weight Llama of a named shape (``vocab``: another vocabulary
    size)."""
    if shape in ("bundled", "draft"):
        from ..models import BUNDLED, Recipe, ensure_draft, load, load_bundled

        if shape == "draft":  # the benchmark's distilled 2-layer draft of the bundled model (distilled on first use)
            return load(ensure_draft(BUNDLED, Recipe(layers=2)), dtype, device, pack=False)[0]
        return load_bundled(dtype, device, pack=False)[0]
    from transformers import LlamaConfig, LlamaForCausalLM

    fields = "hidden_size num_hidden_layers num_attention_heads num_key_value_heads intermediate_size vocab_size"
    config = dict(zip(fields.split(), SHAPES[shape]), max_position_embeddings=4096)
    if vocab:
        config["vocab_size"] = vocab
    torch.manual_seed(0)
    with torch.device(device):
        return LlamaForCausalLM._from_config(LlamaConfig(**config), dtype=dtype).eval()


def weight_bytes(model: nn.Module) -> int:
    return sum({p.data_ptr(): p.numel() * p.element_size() for p in model.parameters()}.values())  # tied: read once


def bandwidth(device: torch.device, mib: int = 1024, repeats: int = 10) -> float:
    """Bytes moved per second by a large copy (read + write), in GB/s."""
    src = torch.empty(mib << 20, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)
    sync(device)
    start = time.perf_counter()
    for _ in range(repeats):
        dst.copy_(src)
    sync(device)
    return 2 * src.numel() * repeats / (time.perf_counter() - start) / 1e9


class OracleDraft(nn.Module):
    """A draft that costs what ``base`` costs and proposes ``reference[pos]`` (the target's greedy token at
    that position) with probability ``a``, another token otherwise; the choice is fixed per position."""

    def __init__(self, base: nn.Module, reference: list[int], a: float, seed: int = 0):
        super().__init__()
        self.base, self.config, self.reference, self.a, self.seed = base, base.config, reference, a, seed

    def get_output_embeddings(self) -> nn.Module:
        return self.base.get_output_embeddings()

    def forward(self, input_ids, past_key_values=None, position_ids=None, **kwargs):
        start = past_key_values.get_seq_length() if position_ids is None else position_ids[0, 0]
        out = self.base(input_ids=input_ids, past_key_values=past_key_values, position_ids=position_ids, **kwargs)
        out.logits = self._choose(out.logits, start, input_ids.shape[1])
        return out

    @torch.compiler.disable  # data-dependent Python: outside the compiled graph
    def _choose(self, rows: torch.Tensor, start, new: int) -> torch.Tensor:
        logits = torch.full_like(rows, -1e4)
        first = int(start) + new - rows.shape[1] + 1  # the position the first row predicts
        for row in range(rows.shape[1]):
            pos = first + row
            want = self.reference[pos] if pos < len(self.reference) else 0
            hit = random.Random(self.seed * 1_000_003 + pos).random() < self.a
            logits[0, row, want if hit else (want + 1) % rows.shape[-1]] = 0.0
        return logits


def oracle_pair(target: nn.Module, draft: nn.Module, a: float, gamma: int, prompt_len: int, new: int, repeats: int):
    """``sd`` over ``large_model`` (median of interleaved runs) for an oracle draft of acceptance ``a``."""
    rng = random.Random(3)
    prompt = [rng.randrange(target.config.vocab_size) for _ in range(prompt_len)]
    reference = prompt + generate([target], prompt, "large_model", max_new_tokens=new).token_ids
    oracle = OracleDraft(draft, reference, a)
    kw = dict(max_new_tokens=new, gamma=gamma, method_args={"proposer": "draft"})
    generate([target, oracle], prompt, "sd", **kw)  # warm-up
    ratios, overhead, accepted = [], [], []
    for _ in range(repeats):
        base = generate([target], prompt, "large_model", max_new_tokens=new).stats
        result = generate([target, oracle], prompt, "sd", **kw)
        if result.token_ids != reference[prompt_len:]:
            raise AssertionError("sd with the oracle draft did not emit the target's greedy tokens")
        sd = result.stats
        ratios.append(base.wall_time_s / sd.wall_time_s)
        inside = sum(m.forward_time_s for m in sd.models)
        overhead.append((sd.wall_time_s - inside) / max(sd.rounds, 1) * 1000)
        accepted.append(sd.accepted / max(sum(m.proposed for m in sd.models), 1))
    return statistics.median(ratios), min(ratios), max(ratios), statistics.median(overhead), statistics.mean(accepted)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pipeline.bench.runners", description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", nargs="+", default=["bundled"], choices=["bundled", "draft", *SHAPES])
    ap.add_argument("--dtype", nargs="+", default=["float32"], choices=list(DTYPES))
    ap.add_argument("--runners", nargs="+", default=["eager", "compiled"], choices=BENCH_RUNNERS)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--ks", type=int, nargs="+", default=[1, 2, 3, 4, 5, 6, 7, 8])
    ap.add_argument("--context", type=int, default=256, help="tokens already in the cache (default 256)")
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--new-tokens", type=int, default=128, help="tokens per generation for tokens/s (default 128)")
    ap.add_argument(
        "--pairs", nargs="*", default=[], help="TARGET:DRAFT shapes for oracle-draft sd (e.g. llama-7b:llama-68m)"
    )
    ap.add_argument("--accept", type=float, nargs="+", default=[0.5, 0.8, 0.95])
    ap.add_argument("--gamma", type=int, nargs="+", default=[3])
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    half = [d for d in args.dtype if DTYPES[d].itemsize < 4]
    if args.pairs and half:
        ap.error(
            f"--pairs with --dtype {' '.join(half)}: oracle pairs need float32 or float64 (in 16 bits a forward of "
            "k tokens rounds differently from k forwards of one, so sd's greedy tokens drift from the target's); "
            "run the pairs in a second call with --dtype float32"
        )
    device = torch.device(args.device)
    report: dict[str, Any] = {"device": str(device), "torch": torch.__version__, "threads": torch.get_num_threads()}
    if device.type == "cuda":
        report["gpu"] = torch.cuda.get_device_name(device)
    report["bandwidth_gb_s"] = bw = bandwidth(device)
    print(f"{report.get('gpu', device)}: copy bandwidth {bw:.0f} GB/s; torch {torch.__version__}", flush=True)

    def save() -> None:  # after every section, so that a run cut short keeps what it measured
        if args.json:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(args.json, json.dumps(report, indent=2, default=str))

    def model(shape: str, dtype: str, runner: str) -> nn.Module:
        from ..models import cpu_kernels

        built = build(shape, DTYPES[dtype], args.device)
        if runner == "eager+pack" and not cpu_kernels.pack_linears(built):
            raise SystemExit("error: eager+pack needs float32 or bfloat16 weights on a CPU with oneDNN")
        return set_runner(built, runner if runner in RUNNERS else runner.split("+")[0])

    report["runners"], report["pairs"], costs = [], [], {}
    for dtype, shape in product(args.dtype, args.shapes):
        start = time.perf_counter()
        contenders = [
            Contender(model(shape, dtype, e), e, args.ks, args.context, args.new_tokens) for e in args.runners
        ]
        gb = weight_bytes(contenders[0].model) / 1e9
        forwards, runs = interleaved(contenders, args.repeats, args.new_tokens)
        first = args.runners[0]
        for runner in args.runners:
            cost = costs[shape, dtype, runner] = {k: statistics.median(v) * 1000 for k, v in forwards[runner].items()}
            tps = sum(t for t, _ in runs[runner]) / sum(w for _, w in runs[runner])
            row = {
                "shape": shape,
                "dtype": dtype,
                "runner": runner,
                "weights_gb": gb,
                "tokens_per_s": tps,
                "bound_tokens_per_s": bw / gb,
                "ms_per_forward": cost,
                "seconds": time.perf_counter() - start,
            }
            line = (
                f"{shape:10} {dtype:9} {runner:16} {tps:7.1f} tok/s (bound {bw / gb:7.1f}, {tps * gb / bw:4.0%})  "
                f"1 token {cost[1]:7.2f} ms  k={args.ks[0]}..{args.ks[-1]}: "
                + " ".join(f"{cost[k] / cost[1]:.2f}" for k in args.ks)
            )
            if runner != first:  # paired by round: the same rounds of the machine
                row["speedup"] = list(series_speedup(runs[runner], runs[first]))
                one_token = [list(zip([1] * len(forwards[e][1]), forwards[e][1])) for e in (runner, first)]
                row["forward_speedup"] = list(series_speedup(*one_token))
                line += f"  over {first}: tokens/s {speed_fmt(*row['speedup'])}, "
                line += f"1 token {speed_fmt(*row['forward_speedup'])}"
            report["runners"].append(row)
            print(line, flush=True)
        del contenders
        save()
    for pair, dtype, runner in product(args.pairs, args.dtype, args.runners):
        t_shape, d_shape = pair.split(":")
        target, draft = model(t_shape, dtype, runner), model(d_shape, dtype, runner)
        t_cost, d_cost = costs.get((t_shape, dtype, runner)), costs.get((d_shape, dtype, runner))
        for a, gamma in product(args.accept, args.gamma):
            with compiling(runner):
                med, low, high, over, acc = oracle_pair(target, draft, a, gamma, 64, args.new_tokens, 5)
            pred = chain_speedup(a, gamma, t_cost, d_cost) if t_cost and d_cost else None
            report["pairs"].append(
                {
                    "pair": pair,
                    "dtype": dtype,
                    "runner": runner,
                    "a": a,
                    "gamma": gamma,
                    "speedup": med,
                    "range": [low, high],
                    "predicted": pred,
                    "acceptance": acc,
                    "overhead_ms_per_round": over,
                }
            )
            ptxt = f"{pred:.2f}x" if pred else "n/a"
            print(
                f"{pair} {dtype} {runner} a={a} γ={gamma}: sd {med:.2f}x [{low:.2f}, {high:.2f}] "
                f"(predicted {ptxt}; acceptance {acc:.2f}; decoder {over:.2f} ms per round)",
                flush=True,
            )
            save()
    return 0


if __name__ == "__main__":
    sys.exit(main())
