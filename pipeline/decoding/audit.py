"""A distribution audit for tests: every distribution the decoder uses, recomputed from scratch.

A slip in the decoder's bookkeeping (a cache crop off by one, a row kept for
the wrong position) may show only deep into a sequence, where a statistical
test of the first tokens cannot see it (``docs/exactness.md``). Given an
``Audit``, the decoder hands it every set of rows it forms a distribution from
and every proposal it verifies; the audit forms the same distribution from one
forward of the whole context, without a cache, in float64, and raises
``AuditError`` on any difference beyond ``tolerance``.

The tolerance: with float64 models the decoder and the audit do the same
arithmetic in another order (forwards of k tokens over a cache against one
forward of the whole context), so they differ by rounding alone. A logit is
a sum of a few thousand products at most in the test models; its rounding
error is below ``n * 2**-53`` times the sum of their magnitudes, about 1e-12,
and softmax, warping and the ensembles move probabilities by no more than
the logits move. ``1e-9`` leaves a factor of a thousand for that, and is far
below what a bookkeeping slip does (a row computed from another context moves
probabilities by 1e-3 to 1). Lower-precision models need a larger tolerance.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor

from .ensembles import single_model
from .sampling import Sampling


class AuditError(AssertionError):
    """A distribution of the decoder differs from its recompute from scratch."""


class Audit:
    def __init__(self, models: Sequence[torch.nn.Module], tolerance: float = 1e-9):
        self.models = [m if next(m.parameters()).dtype == torch.float64 else copy.deepcopy(m).double() for m in models]
        self.tolerance = tolerance
        self.checked = 0  # distributions (one per position) compared
        self.max_difference = 0.0
        self._last: dict[int, tuple[tuple[int, ...], Tensor]] = {}  # model -> its last context and logits

    def check(
        self,
        tokens: list[int],
        start: int,
        stop: int,
        rows: Sequence[Tensor],
        models: Sequence[int],
        fn: Callable[[Sequence[Tensor], Sampling], Tensor],
        sampling: Sampling,
    ) -> None:
        """Compare ``fn`` of the decoder's ``rows`` (of ``models``, for positions ``[start, stop)``) with
        ``fn`` of fresh rows; greedy distributions are formed with ``Sampling.identity()``."""
        sampling = Sampling.identity() if sampling.greedy else sampling
        if any(r.shape[0] != stop - start for r in rows):
            raise AuditError(f"the decoder lacks logits rows for positions {start}..{stop - 1}")
        fresh = [self._rows(i, tokens, start, stop)[:, : r.shape[-1]] for i, r in zip(models, rows)]
        got = fn([r.double() for r in rows], sampling)
        self._compare(got, fn(fresh, sampling), f"the distribution at positions {start}..{stop - 1}")

    def check_proposals(self, tokens: list[int], start: int, pending: Sequence, sampling: Sampling) -> None:
        """The proposals verified from ``start`` on: their tokens and the distributions they were drawn from."""
        for pos, p in enumerate(pending, start):
            if p.token != tokens[pos]:
                raise AuditError(f"the proposal verified at position {pos} is {p.token}; the context has {tokens[pos]}")
            if p.q is not None:  # drawn from a model's own distribution (proposers.ModelProposer) or a head's
                fresh = self._proposer_row(p.by, tokens, pos)[:, : p.q.shape[-1]]
                self._compare(p.q.double()[None], single_model([fresh], sampling), f"the proposal at position {pos}")

    def check_proposer_row(self, by: Any, context: list[int], row: Tensor, sampling: Sampling) -> None:
        """A token tree's node: the logits ``row`` proposer ``by`` drew its children from after ``context``."""
        sampling = Sampling.identity() if sampling.greedy else sampling
        fresh = self._proposer_row(by, context, len(context))[:, : row.shape[-1]]
        got = single_model([row.double()[None]], sampling)
        self._compare(got, single_model([fresh], sampling), f"the tree's draft distribution at {len(context)}")

    def _proposer_row(self, by: Any, tokens: list[int], pos: int) -> Tensor:
        """Float64 logits of proposer ``by`` for position ``pos`` of ``tokens``, from scratch: a proposer with a
        network of its own (feature.py) recomputes it; a model of the set is run without a cache."""
        if hasattr(by, "recompute"):
            return by.recompute(tokens, pos).double()[None]
        return self._rows(by.index, tokens, pos, pos + 1)

    def _rows(self, index: int, tokens: list[int], start: int, stop: int) -> Tensor:
        """Float64 logits rows predicting positions ``[start, stop)``, from one forward without a cache."""
        context, logits = self._last.get(index, ((), None))
        if len(context) < stop - 1 or context[: stop - 1] != tuple(tokens[: stop - 1]):
            model = self.models[index]
            ids = torch.tensor([tokens], device=next(model.parameters()).device)
            context, logits = tuple(tokens), model(input_ids=ids, use_cache=False).logits[0].double()
            self._last[index] = context, logits  # rows of a causal model depend on earlier tokens only
        return logits[start - 1 : stop - 1]

    def _compare(self, got: Tensor, want: Tensor, what: str) -> None:
        difference = float((got - want).abs().max())
        self.checked += got.shape[0]
        self.max_difference = max(self.max_difference, difference)
        if not difference <= self.tolerance:
            raise AuditError(
                f"{what}: the decoder's differs from a recompute from scratch by {difference:.3g} "
                f"(tolerance {self.tolerance:g})"
            )
