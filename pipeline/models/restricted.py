"""A causal LM whose output head scores only a fixed subset of the vocabulary.

Every id outside the subset gets logit -inf, so its probability is exactly
zero: such a model is a valid proposer (a token it proposes always has
q > 0) and a valid weighted-ensemble member, but not a contrastive-decoding
member, which needs full-vocabulary logits. Scoring 4,096 ids instead of
49,152 makes a shallow draft of SmolLM2 several times cheaper.
"""

from __future__ import annotations

from types import SimpleNamespace

import torch
from torch import nn


class RestrictedHeadLM(nn.Module):
    restricted_vocab = True

    def __init__(self, base: nn.Module, kept: list[int]):
        super().__init__()
        self.base = base
        self.config = base.config
        full = base.get_output_embeddings().weight
        self.vocab_size = int(full.shape[0])
        self.register_buffer("kept", torch.tensor(sorted(kept), dtype=torch.long, device=full.device), persistent=False)
        self.head = nn.Linear(full.shape[1], len(kept), bias=False, device=full.device, dtype=full.dtype)
        with torch.no_grad():
            self.head.weight.copy_(full[self.kept])

    def get_output_embeddings(self) -> nn.Module:
        return self.base.get_output_embeddings()

    def head_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits over the kept ids only: ``[..., len(kept)]``."""
        return self.head(hidden)

    def forward(self, input_ids, past_key_values=None, use_cache=True, logits_to_keep: int = 0, **kwargs):
        out = self.base.model(input_ids=input_ids, past_key_values=past_key_values, use_cache=use_cache, **kwargs)
        hidden = out.last_hidden_state
        if logits_to_keep:
            hidden = hidden[:, -logits_to_keep:]
        small = self.head_logits(hidden)
        logits = small.new_full((*small.shape[:-1], self.vocab_size), float("-inf"))
        logits.index_copy_(-1, self.kept, small)
        return SimpleNamespace(logits=logits, past_key_values=out.past_key_values)
