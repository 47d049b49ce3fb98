"""The gated ensemble, ``gac`` (GaC, Yu et al. 2024): the lead model alone where it is confident, the weighted
ensemble elsewhere; the worked example of docs/extending.md."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from ...errors import ArgumentError
from ..sampling import Sampling, probs
from .base import check_weights, finite, register_ensemble
from .we import weighted_ensemble


def _check_gac(args: dict[str, Any], n_models: int) -> dict[str, Any]:
    threshold = args.get("threshold")
    if not finite(threshold) or not 0.0 < threshold <= 1.0:
        raise ArgumentError(f"threshold={threshold!r} is outside the accepted range (0, 1]")
    return check_weights(args, n_models)


@register_ensemble(  # test_args: a threshold at which a tiny model is confident at some positions only
    "gac", params={"threshold": 0.5, "weights": None, "lambda": None}, check=_check_gac, test_args={"threshold": 0.3}
)
def gated_ensemble(logits: Sequence[Tensor], sampling: Sampling, threshold: float, weights: Sequence[float]) -> Tensor:
    """The lead model (the first) alone where it is confident, the weighted ensemble elsewhere.

    The threshold gate of GaC (Yu et al. 2024, arXiv 2406.12585): ``r = p_lead``
    where ``max softmax(l_lead) >= threshold``, ``r = sum_k w_k p_k`` elsewhere.

    The gate reads the lead model's plain softmax (temperature 1, no top-k or
    top-p), so a position is gated the same way whatever the sampling settings.
    """
    lead = logits[0]
    confident = torch.softmax(lead, dim=-1).amax(dim=-1, keepdim=True) >= threshold
    if bool(confident.all()):  # the other members' rows are not needed
        return probs(lead, sampling)
    return torch.where(confident, probs(lead, sampling), weighted_ensemble(logits, sampling, weights))
