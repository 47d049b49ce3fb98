"""Benchmark of ensembles over a union vocabulary: ``we``, ``we_sd``, ``we_se``, ``we_me`` on a set of models
with different tokenizers, interleaved, and the share of decode time spent mapping rows into the union.

    python -m pipeline.bench.union --quick       # the bundled model and a 2-layer copy, 3 prompts, 32 tokens

Without a second model family on the machine, the pair is the bundled model
and a truncated copy of it read through ``sentencepiece_twin`` (a different
tokenizer of the real size), so the union is built, mapped and fed as for two
families. Other callers pass their own models and tokenizers to ``bench_union``.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import Any

import torch

from pipeline.bench.table import measure
from pipeline.decoding import generate
from pipeline.decoding.spec import parse_method
from pipeline.decoding.union import byte_level_table
from pipeline.files import write_atomic
from pipeline.measure.speed import fmt, series_speedup

METHODS = ("we", "we_sd", "we_se", "we_me")


def sentencepiece_twin(tokenizer: Any) -> Any:
    """A byte-level BPE tokenizer's vocabulary respelled SentencePiece-style, its ids reversed (a different
    tokenizer of the same size): tokens that are text are that text with ``▁`` for a space, single bytes
    that are not text alone are ``<0xNN>`` byte-fallback tokens, longer pieces of a character are unused
    specials; merges between text tokens are kept."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    spec = json.loads(tokenizer.backend_tokenizer.to_str())
    table = byte_level_table()
    size = len(tokenizer)
    special = set(tokenizer.all_special_ids)
    vocab: dict[str, int] = {}
    unused: list[str] = []
    spelled: dict[str, str] = {}
    for token, i in spec["model"]["vocab"].items():
        new_id = size - 1 - i
        if i in special:
            name = tokenizer.convert_ids_to_tokens(i)
        else:
            raw = bytes(table[c] for c in token)
            try:
                name = spelled[token] = raw.decode().replace(" ", "▁")
            except UnicodeDecodeError:
                name = f"<0x{raw[0]:02X}>" if len(raw) == 1 else f"<unused{i}>"
                if len(raw) > 1:
                    unused.append(name)
        vocab[name] = new_id
    merges = [(spelled[a], spelled[b]) for a, b in spec["model"]["merges"] if a in spelled and b in spelled]
    merges = [(a, b) for a, b in merges if a + b in vocab]
    twin = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token=None, byte_fallback=True))
    twin.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="never")
    twin.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()])
    specials = [tokenizer.convert_ids_to_tokens(i) for i in sorted(special)] + unused
    twin.add_special_tokens([AddedToken(t, special=True) for t in specials])
    return PreTrainedTokenizerFast(tokenizer_object=twin, eos_token=tokenizer.eos_token)


def reverse_head(model: torch.nn.Module) -> torch.nn.Module:
    """The model with its embedding and output rows in reverse order (the ids of ``sentencepiece_twin``)."""
    with torch.no_grad():
        weights = (model.get_input_embeddings().weight, model.get_output_embeddings().weight)
        for weight in {id(w): w for w in weights}.values():  # tied embeddings are flipped once
            weight.copy_(weight.flip(0))
    return model


def bench_union(
    models: Sequence[torch.nn.Module],
    tokenizers: Sequence[Any],
    prompts: Sequence[str],
    methods: Sequence[str] = METHODS,
    gamma: int = 2,
    max_new_tokens: int = 32,
    temperature: float = 1.0,
    weights: Sequence[float] | None = None,
) -> list[dict[str, Any]]:
    """Each method over every prompt, in a rotating order after a warm-up; per method: tokens per second,
    the speed-up over ``we`` with its 95% paired interval over prompts, tau, and ``union_map_s`` as a
    share of wall time."""
    args = {"weights": list(weights)} if weights is not None else {}
    cheap = min(range(len(models)), key=lambda i: sum(p.numel() for p in models[i].parameters()))
    turns = [gamma if i == cheap else 1 for i in range(len(models))]  # *_se: the cheapest model drafts gamma
    kw = {m: {"gamma": list(turns) if parse_method(m).in_turn else gamma} for m in methods}
    eos = tokenizers[0].eos_token_id

    def run(m: str, ids: list[int], n: int, seed: int):
        return generate(
            list(models), ids, m, max_new_tokens=n, temperature=temperature, seed=seed, eos_token_id=eos,
            tokenizers=list(tokenizers), method_args=args, **kw[m],
        )  # fmt: skip

    encoded = [tokenizers[0](p).input_ids for p in prompts]
    totals = measure([(m, partial(run, m)) for m in methods], encoded, max_new_tokens, 4)
    rows = []
    for m in methods:
        t = totals[m]
        ratio, low, high = series_speedup(t.per_prompt, totals[methods[0]].per_prompt)
        map_s = sum(s["union_map_s"] for s in t.stats)
        rows.append(
            {
                "method": m,
                "tokens": t.tokens,
                "tok_s": t.tokens / t.wall,
                "speedup": ratio,
                "interval": [low, high],
                "tau": t.tokens / t.target_calls if t.target_calls else None,
                "union_size": int(t.stats[-1]["union_size"]),
                "union_map_share": map_s / t.wall,
                "union_map_ms_per_token": 1000 * map_s / t.tokens if t.tokens else None,
            }
        )
    return rows


def render_table(rows: list[dict[str, Any]]) -> str:
    lines = [
        f"| method | tok/s | speed-up over {rows[0]['method']} [95% interval] | τ | union map share | map ms/token |",
        "|---|---:|---|---:|---:|---:|",
    ]
    for r in rows:
        tau = f"{r['tau']:.2f}" if r["tau"] else "-"
        lines.append(
            f"| {r['method']} | {r['tok_s']:.1f} | {fmt(r['speedup'], *r['interval'])} | {tau} "
            f"| {100 * r['union_map_share']:.1f}% | {r['union_map_ms_per_token']:.3f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    from pipeline.bench.methods import FALLBACK_PROMPTS, humaneval_prompts
    from pipeline.models import load_bundled, truncated_copy

    ap = argparse.ArgumentParser(prog="python -m pipeline.bench.union", description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=6)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--gamma", type=int, default=2)
    ap.add_argument("--draft-layers", type=int, default=4)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--quick", action="store_true", help="3 prompts, 32 tokens")
    ap.add_argument("--json", help="also write the rows as JSON here")
    args = ap.parse_args(argv)
    if args.quick:
        args.prompts, args.max_new_tokens = 3, 32
    model, tokenizer = load_bundled(pack=False)  # the draft's rows are reordered in place: plain layers
    draft = reverse_head(truncated_copy(model, args.draft_layers))
    twin = sentencepiece_twin(tokenizer)
    prompts = humaneval_prompts(args.prompts) if args.prompts > len(FALLBACK_PROMPTS) else FALLBACK_PROMPTS
    rows = bench_union(
        [model, draft], [tokenizer, twin], prompts[: args.prompts], gamma=args.gamma,
        max_new_tokens=args.max_new_tokens, temperature=args.temperature,
    )  # fmt: skip
    print(render_table(rows))
    print(f"union of {rows[0]['union_size']} strings; map share: union_map_s over wall time", file=sys.stderr)
    if args.json:
        write_atomic(Path(args.json), json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
