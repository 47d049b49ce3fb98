"""Contrastive decoding, ``cd`` (Li et al. 2023): the expert's logits less ``alpha`` times the amateur's, over
the expert's plausible set."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from ...errors import ArgumentError
from ..sampling import Sampling, probs
from .base import finite, register_ensemble


def _check_cd(args: dict[str, Any], n_models: int) -> dict[str, Any]:
    alpha, beta = args.get("alpha"), args.get("beta")
    if not finite(alpha) or alpha < 0:
        raise ArgumentError(f"alpha={alpha!r}: expected a finite number >= 0")
    if beta is not None and (not finite(beta) or not 0.0 <= beta <= 1.0):
        raise ArgumentError(f"beta={beta!r} is outside the accepted range [0, 1] (or null for no plausibility mask)")
    return args


@register_ensemble(
    "cd",
    params={"alpha": 0.1, "beta": None},
    max_models=2,
    check=_check_cd,
    full_vocab=True,
    test_args={"alpha": 0.3, "beta": 0.05},
)
def contrastive_decoding(logits: Sequence[Tensor], sampling: Sampling, alpha: float, beta: float | None) -> Tensor:
    """``r = softmax(warp(l_expert - alpha * l_amateur))`` over the plausible set."""
    expert, amateur = logits
    scores = expert - alpha * amateur
    if beta:
        expert_probs = torch.softmax(expert, dim=-1)
        implausible = expert_probs < beta * expert_probs.amax(dim=-1, keepdim=True)
        scores = scores.masked_fill(implausible, float("-inf"))
    return probs(scores, sampling)
