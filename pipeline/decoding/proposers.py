"""Proposers: each proposes the next token and the distribution it was drawn from.

The distribution is ``None`` for a one-hot proposal (a deterministic function
of the context). The speculative loop knows proposers only through
:class:`Proposer`: a model, prompt lookup (``lookup.py``) or a chain of them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import torch
from torch import Tensor

from ..errors import ArgumentError
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

    # A token tree (tree/draft.py) asks a proposer for several candidates at a node through one of two optional
    # methods; a proposer with neither drafts chains only, and a tree refuses it in one line (``drafts_trees``):
    #   continuations(context: list[int], limit: int) -> list[int]: up to ``limit`` distinct one-hot candidates
    #       for the token after ``context`` (a deterministic function of it, as prompt lookup's);
    #   logits(context: list[int]) -> Tensor | None: the logits row ``[V]`` its draws for the token after
    #       ``context`` come from (the tree draws its children from it: top tokens greedy, samples otherwise).


def parts(proposer: Proposer) -> list[Proposer]:
    """A turn's proposers in the order they are asked (a chain's, or the one)."""
    return list(proposer.proposers) if isinstance(proposer, Chain) else [proposer]


def drafts_trees(proposer: object) -> bool:
    """Whether a proposer (class or instance) can draft a token tree's several candidates per node: a model of
    the set, or one with ``continuations`` or ``logits``."""
    return isinstance(proposer, ModelProposer) or any(hasattr(proposer, m) for m in ("continuations", "logits"))


DRAFT = "draft"  # in a proposer kind: the turn's own model
NAMED_PROPOSERS: dict[str, Callable[[], Proposer]] = {}  # proposers that are not models, by name


def register_proposer(name: str) -> Callable[[type], type]:
    """Register a proposer that is not a model under ``name`` (a decorator on its class, built without
    arguments, one instance per generation): ``name`` and ``name+draft`` become proposer kinds."""

    def decorator(cls: type) -> type:
        if name in NAMED_PROPOSERS or name == DRAFT or not name.isidentifier():
            raise ArgumentError(f"cannot register proposer {name!r}: name taken or not a plain identifier")
        NAMED_PROPOSERS[name] = cls
        return cls

    return decorator


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
