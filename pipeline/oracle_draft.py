"""A draft whose acceptance is set by construction, and ``sd`` with it against ``large_model``
(``engine_bench --pairs``)."""

from __future__ import annotations

import random
import statistics

import torch
from torch import nn

from .decoding import generate


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
