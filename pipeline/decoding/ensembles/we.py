"""The weighted ensemble, ``we``: ``r = sum_k w_k softmax(warp(l_k))`` (a mixture: ``we_me`` samples it as one)."""

from __future__ import annotations

from collections.abc import Sequence

from torch import Tensor

from ..sampling import Sampling, probs
from .base import check_weights, register_ensemble


@register_ensemble("we", params={"weights": None, "lambda": None}, check=check_weights, mixture=True)
def weighted_ensemble(logits: Sequence[Tensor], sampling: Sampling, weights: Sequence[float]) -> Tensor:
    """``r = sum_k w_k softmax(warp(l_k))``."""
    out = None
    for w, row in zip(weights, logits):
        if w == 0.0:
            continue
        term = probs(row, sampling) * w
        out = term if out is None else out.add_(term)
    return out
