"""Prepacked linear layers for float32 inference on the CPU.

MKL's ``nn.Linear`` runs 2-3 new tokens, the forwards speculative verification
runs, as that many matrix-vector products; oneDNN with weights reordered once
keeps a forward of 1-4 tokens at about the cost of one (``docs/decoder.md``).
Every method then runs on the same kernels, baselines included.
"""

from __future__ import annotations

import copy

import torch
from torch import nn


def available() -> bool:
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


class PackedLinear(nn.Module):
    """An inference-only ``nn.Linear`` with a oneDNN-reordered copy of its weight."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight = linear.weight  # kept: tied embeddings, parameter counts, output-embedding lookups
        self.bias = linear.bias
        self.packed = torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach(), None)

    def __deepcopy__(self, memo: dict) -> PackedLinear:  # the packed copy is opaque: pack the copied weight again
        linear = nn.Linear(self.in_features, self.out_features, bias=self.bias is not None, device="meta")
        linear.weight = copy.deepcopy(self.weight, memo)
        linear.bias = copy.deepcopy(self.bias, memo)
        return PackedLinear(linear)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bias = None if self.bias is None else self.bias.detach()
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, bias, "none", [], "")


def pack_linears(model: nn.Module) -> int:
    """Replace every float32 CPU ``nn.Linear`` in ``model`` by a ``PackedLinear``; returns how many."""
    if not available():
        return 0
    count = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is nn.Linear and child.weight.dtype == torch.float32 and child.weight.device.type == "cpu":
                setattr(parent, name, PackedLinear(child))
                count += 1
    return count
