"""Proposers: each proposes the next token and the distribution it was drawn from.

The distribution is ``None`` for a one-hot proposal (a deterministic function
of the context). The speculative loop knows proposers only through
:class:`Proposer`: a model, prompt lookup (``lookup.py``) or a chain of them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import torch
from torch import Tensor

from .ensemble import single_model
from .sampling import Sampling, probs, sample
from .stats import ModelStats

if TYPE_CHECKING:
    from .audit import Audit
    from .member import Member


@dataclass
class Proposal:
    token: int
    q: Tensor | None  # [V]: the distribution the token was drawn from; None: one-hot
    by: Proposer
    turn: int = -1  # the schedule's turn that drafted it (set by the decoder)


class Proposer(Protocol):
    stats: ModelStats  # its proposals, counted (a chain has none of its own: each counts for its maker)

    def feed(self, tokens: list[int], committed: int) -> None:
        """Its turn begins: take in ``tokens`` (``tokens[:committed]`` are final)."""

    def draft(self, tokens: list[int], committed: int) -> Proposal | None:
        """A proposal for the token at ``len(tokens)``, or None when it has none."""


class ModelProposer:
    """A model of the ensemble: samples the next token from its own warped logits (argmax if greedy)."""

    def __init__(
        self, index: int, member: Member, sampling: Sampling, generator: torch.Generator | None, audit: Audit | None
    ):
        self.index, self.member, self.sampling, self.generator, self.audit = index, member, sampling, generator, audit
        self.stats = member.stats

    def feed(self, tokens: list[int], committed: int) -> None:
        self.member.catch_up(tokens, committed)

    def draft(self, tokens: list[int], committed: int) -> Proposal | None:
        self.member.catch_up(tokens, committed)  # lazily feeds tokens another proposer added
        pos = len(tokens)
        row = self.member.span(pos, pos + 1)
        if self.audit is not None:
            self.audit.check(tokens, pos, pos + 1, [row], [self.index], single_model, self.sampling)
        if self.sampling.greedy:
            return Proposal(int(row[0].argmax()), None, self)
        q = probs(row, self.sampling)
        return Proposal(int(sample(q, self.generator)[0]), q[0], self)


class Chain:
    """Proposers asked in order: the first with a proposal makes it (and has it counted)."""

    def __init__(self, proposers: list[Proposer]):
        self.proposers = proposers

    def feed(self, tokens: list[int], committed: int) -> None:
        for p in self.proposers:
            p.feed(tokens, committed)

    def draft(self, tokens: list[int], committed: int) -> Proposal | None:
        for p in self.proposers:
            proposal = p.draft(tokens, committed)
            if proposal is not None:
                return proposal
        return None
