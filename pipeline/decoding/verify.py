"""The acceptance rule, written once for every speculative method.

A block of ``k`` proposed tokens is checked, in order, against the target
distribution at each position:

* sampling: accept ``x_j`` iff ``u_j < r_j(x_j) / q_j(x_j)`` with ``u_j ~ U(0, 1)``;
  at the first rejection emit ``y ~ norm(max(0, r_j - q_j))``;
* greedy: accept ``x_j`` iff ``x_j == argmax r_j``; at the first rejection emit
  ``argmax r_j``.

``q_j`` is the distribution the token was actually sampled from. A proposal
that did not come from a distribution (prompt lookup, for instance) is
one-hot: pass ``None`` for its row. Bonus tokens after a fully accepted block
are not drawn here: the caller samples them from the target with
``sampling.sample``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from .sampling import sample


def _first_false(mask: Tensor) -> int:
    """Index of the first False in a 1-D bool tensor, or its length (one host sync)."""
    flags = mask.tolist()
    return flags.index(False) if False in flags else len(flags)


def verify_greedy(target_tokens: Tensor, proposed: Tensor) -> tuple[int, int | None]:
    """Greedy verification. Returns (accepted count, correction token or None)."""
    n = _first_false(target_tokens == proposed)
    return n, (int(target_tokens[n]) if n < len(proposed) else None)


def verify_sampled(
    target: Tensor,
    proposed: Tensor,
    draft: Sequence[Tensor | None],
    generator: torch.Generator | None,
) -> tuple[int, int | None]:
    """Speculative sampling over a block.

    target: ``[k, V]`` target probabilities at the proposed positions;
    proposed: ``[k]`` tokens; draft: per token its proposal row ``[V]`` or
    ``None`` for a one-hot proposal. Returns (accepted count, residual token or
    None when all ``k`` are accepted).
    """
    k = proposed.shape[0]
    idx = proposed.unsqueeze(-1)
    p_x = target.gather(-1, idx).squeeze(-1)
    q_rows = list(draft)
    q_x = torch.ones_like(p_x)
    dense = [j for j, row in enumerate(q_rows) if row is not None]
    if dense:
        stacked = torch.stack([q_rows[j] for j in dense])
        q_x[dense] = stacked.gather(-1, idx[dense]).squeeze(-1)
    u = torch.rand(k, generator=generator, dtype=p_x.dtype, device=p_x.device)
    n = _first_false(u * q_x < p_x)  # q_x > 0: every proposal was drawn from q
    if n == k:
        return n, None
    return n, int(sample(residual(target[n], q_rows[n], int(proposed[n])).unsqueeze(0), generator))


def residual(target: Tensor, q: Tensor | None, token: int) -> Tensor:
    """``max(0, r - q)`` (unnormalised) after ``token``, drawn from ``q`` (None: one-hot), was rejected
    against ``r``; ``r`` itself where rounding left no mass."""
    out = target.clone()
    if q is None:
        out[token] = 0.0
    else:
        out = (out - q).clamp_(min=0.0)
    return out if out.sum() > 0 else target


def accept_one(target: Tensor, q: Tensor | None, token: int, generator: torch.Generator | None) -> bool:
    """One proposal ``token`` drawn from ``q`` (None: one-hot) against ``target`` (probabilities): accept with
    probability ``min(1, r(x) / q(x))``; the same test as ``verify_sampled``."""
    r_x = target[token]
    q_x = 1.0 if q is None else q[token]
    u = torch.rand(1, generator=generator, dtype=target.dtype, device=target.device)
    return bool(u * q_x < r_x)
