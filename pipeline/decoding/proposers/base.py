"""Proposers: each proposes the next token, the distribution it was drawn from, and how sure it is.

The distribution is ``None`` for a one-hot proposal (a deterministic function of the context); the confidence,
where a proposer gives one, a function of the context alone (``Proposal.confidence``: how far a chain drafts). The
speculative loop knows proposers only through :class:`Proposer`: a model of the set (``ModelProposer``), a named
proposer registered by its module in this folder (``lookup.py``, ``suffix.py``, ``recycle.py``, ``feature.py``:
``register_proposer``, ``NamedProposer``'s declarations), or a chain of them (``Chain``), parsed once from a
``proposer`` value (``parse_proposer``). A registration also says how the exactness suites run the proposer
(``ProposerTests``); the suites take their proposer kinds from the registry (``conformance_kinds``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

import torch
from torch import Tensor

from ...errors import ArgumentError
from ..ensembles import single_model
from ..sampling import Sampling, probs, sample
from ..stats import ModelStats

if TYPE_CHECKING:
    from ..audit import Audit
    from ..member import Member


@dataclass
class Proposal:
    token: int
    q: Tensor | None  # [V]: the distribution the token was drawn from; None: one-hot
    by: Proposer
    turn: int = -1  # the schedule's turn that drafted it (set by the decoder)
    # the proposer's own estimate of the chance the token is kept (None: none), a function of the context only; a
    # chain drafts on while the product of its proposals' estimates stays at or above ``least_reach``
    # (``loop.Decoder._draft``)
    confidence: float | None = None


class Proposer(Protocol):
    stats: ModelStats  # its proposals, counted (a chain has none of its own: each counts for its maker)

    def feed(self, tokens: list[int], committed: int) -> None:
        """Its turn begins: take in ``tokens`` (``tokens[:committed]`` are final)."""

    def draft(self, tokens: list[int], committed: int) -> Proposal | None:
        """A proposal for the token at ``len(tokens)``, or None when it has none."""


@dataclass(frozen=True)
class ProposerSetup:
    """What a named proposer may be built from, one generation's (``NamedProposer.for_decoder``): the members
    (each model's runner), the sampling settings and generator, and the text the job lets it search
    (``suffix.CorpusView``, None: the context alone)."""

    members: list
    sampling: Sampling
    generator: torch.Generator | None
    corpus: object = None
    least_reach: float = 0.0  # the method's ``least_reach``: above 0, the models say how sure each proposal is


class NamedProposer:
    """The base of a proposer that is not a model of the set, registered by name (``register_proposer``).

    It declares what it can do, and the decoder reads the declarations, never probes for methods:

    * ``branches``: it gives several candidates for one position (``continuations``: distinct one-hot tokens,
      or ``logits``: a row its draws come from), so it can draft a token tree; one that cannot is refused by a
      tree in one line when the config is checked;
    * ``watches``: it reads the target's distribution at every verified position (``observe``): the rows the
      verification computed anyway, before anything is accepted;
    * ``reads_corpus``: it reads the job's corpus (``ProposerSetup.corpus``): the text it holds, or what the
      generations of the job's earlier prompts left there;
    * ``reads_features``: it drafts from the target's features, through a feature head of the set's first model
      (the ``eagle`` entry of that model in a config): a config whose first models have none is refused in one
      line when it is checked.

    One instance serves one generation: ``for_decoder(setup)`` builds it (by default without arguments), ``close``
    is called when the generation ends.
    """

    branches: ClassVar[bool] = False
    watches: ClassVar[bool] = False
    reads_corpus: ClassVar[bool] = False
    reads_features: ClassVar[bool] = False
    stats: ModelStats

    @classmethod
    def for_decoder(cls, setup: ProposerSetup) -> NamedProposer:
        return cls()

    def feed(self, tokens: list[int], committed: int) -> None:
        """Its turn begins: take in ``tokens`` (``tokens[:committed]`` are final). Nothing by default."""

    def draft(self, tokens: list[int], committed: int) -> Proposal | None:
        raise NotImplementedError

    def continuations(self, context: list[int], limit: int) -> list[int]:
        """Up to ``limit`` distinct one-hot candidates for the token after ``context`` (a deterministic function of
        it and of what the proposer has observed), best first; none by default."""
        return []

    def logits(self, context: list[int]) -> Tensor | None:
        """The logits row ``[V]`` its draws for the token after ``context`` come from (a tree draws a node's
        children from it); None by default."""
        return None

    def observe(self, before: list[int], rows: Tensor) -> None:
        """The target's rows ``[n, V]`` (logits or probabilities) at ``n`` verified positions, ``before[j]`` the
        token each position follows (``watches`` proposers only)."""

    def close(self) -> None:
        """The generation is over."""


@dataclass(frozen=True)
class Capabilities:
    """What a named proposer can do (``NamedProposer``'s declarations, or for a class written to the protocol
    alone, the optional methods it has, read once here)."""

    branches: bool
    watches: bool
    reads_corpus: bool
    reads_features: bool


def capabilities(cls: type) -> Capabilities:
    if isinstance(cls, type) and issubclass(cls, NamedProposer):
        return Capabilities(cls.branches, cls.watches, cls.reads_corpus, cls.reads_features)
    branches = any(hasattr(cls, m) for m in ("continuations", "logits"))
    return Capabilities(branches, hasattr(cls, "observe"), False, False)


def build(cls: type, setup: ProposerSetup) -> Proposer:
    """One generation's instance of a named proposer: its ``for_decoder(setup)`` (a class written to the protocol
    alone and without one: built without arguments)."""
    return cls.for_decoder(setup) if hasattr(cls, "for_decoder") else cls()


def close(proposer: Proposer) -> None:
    """The generation is over: a proposer that holds something (the feature head's hook on a model) lets it go."""
    if hasattr(proposer, "close"):
        proposer.close()


def parts(proposer: Proposer) -> list[Proposer]:
    """A turn's proposers in the order they are asked (a chain's, or the one)."""
    return list(proposer.proposers) if isinstance(proposer, Chain) else [proposer]


def tree_proposer_problem(named: Iterable[str]) -> str | None:
    """Why proposers of these names cannot draft a token tree (None: they can), in the words the config check and
    ``generate`` both say it: the first that gives one candidate per position."""
    cannot = [n for n in named if not capabilities(NAMED_PROPOSERS[n]).branches]
    if not cannot:
        return None
    return (
        f"proposer {cannot[0]!r}, which drafts one candidate per position and cannot draft a token tree (it has "
        "neither continuations nor logits); drop the tree or use another proposer"
    )


def drafts_trees(proposer: object) -> bool:
    """Whether a proposer (class or instance) can draft a token tree's several candidates per node: a model of
    the set, or a named proposer that ``branches``."""
    if isinstance(proposer, ModelProposer):
        return True
    return capabilities(proposer if isinstance(proposer, type) else type(proposer)).branches


DRAFT = "draft"  # in a proposer kind: the turn's own model
NAMED_PROPOSERS: dict[str, Callable[[], Proposer]] = {}  # proposers that are not models, by name


@dataclass(frozen=True)
class ProposerTests:
    """The arguments the exactness suites run a registered proposer with (``register_proposer(test_args=)``):
    greedy identity over the speculative methods, chains and trees (tests/test_proposers.py, tests/test_trees.py)
    and the chi-square check of the first two tokens (tests/test_proposers.py). What the class declares is read
    from it, never repeated here: ``branches`` puts it under the tree cases, ``reads_corpus`` hands it a job's
    corpus, ``reads_features`` a feature head on the first model (``capabilities``).

    * ``method_args``: its cases' ``method_args`` beside ``proposer`` (none by default);
    * ``alone``: cases of it alone (``NAME``: no model drafts, the target verifies it);
    * ``draft``: cases of it before the draft model (``NAME+draft``, or with ``chain``, ``NAME+chain+draft``;
      left out where another proposer's chain before the draft holds it);
    * ``chain``: registered proposers asked after it in its chained cases (``suffix``'s: ``recycle``, so
      ``suffix+recycle`` and ``suffix+recycle+draft``).
    """

    method_args: Mapping[str, Any] = field(default_factory=dict)
    alone: bool = True
    draft: bool = True
    chain: tuple[str, ...] = ()

    def __post_init__(self):
        object.__setattr__(self, "chain", (self.chain,) if isinstance(self.chain, str) else tuple(self.chain))
        if not isinstance(self.method_args, Mapping) or "proposer" in self.method_args:
            raise ArgumentError(f"test_args method_args={self.method_args!r}: expected a dict without 'proposer'")
        if not (self.alone or self.draft) or not all(isinstance(n, str) and n.isidentifier() for n in self.chain):
            raise ArgumentError(
                f"test_args alone={self.alone!r}, draft={self.draft!r}, chain={self.chain!r}: expected a case alone "
                "or before the draft (test_args=None: none), and proposers' names"
            )


DEFAULT_TESTS = ProposerTests()  # a proposer that declares none: its cases alone and before the draft, no arguments
PROPOSER_TESTS: dict[str, ProposerTests | None] = {}  # what each registered proposer declared for the suites


def conformance_proposers() -> dict[str, ProposerTests]:
    """Every registered proposer the exactness suites run (greedy identity, chi-square sampling, trees), with the
    arguments it declared for them: registering one puts it under every suite, no test edited."""
    return {n: t for n in NAMED_PROPOSERS if (t := PROPOSER_TESTS.get(n)) is not None}


@dataclass(frozen=True)
class ConformanceKind:
    """A proposer kind the exactness suites run, derived from the registrations (``conformance_kinds``): ``role``
    ``alone`` (``NAME``), ``chain`` (``NAME+chain``, where it declares one) or ``draft`` (``NAME+chain+draft``),
    and the ``method_args`` its parts declared."""

    role: str
    kind: str
    method_args: Mapping[str, Any]


def conformance_kinds() -> list[ConformanceKind]:
    """The proposer kinds the exactness suites run, in registration order: each proposer alone, chained (its
    ``chain``) and before the draft model, as it declared (``ProposerTests``); a drafted kind is left out where
    another's drafted chain holds it (``suffix+recycle+draft`` stands for ``recycle+draft``)."""
    tests = conformance_proposers()
    for name, t in tests.items():
        if unknown := [n for n in t.chain if n not in tests]:
            raise ArgumentError(f"proposer {name!r}: test_args chain names {unknown[0]!r}, no proposer under the tests")
    kinds: list[ConformanceKind] = []
    drafted = {name: (name, *t.chain) for name, t in tests.items() if t.draft}
    for name, t in tests.items():
        args = {k: v for n in (name, *t.chain) for k, v in tests[n].method_args.items()}
        if t.alone:
            kinds.append(ConformanceKind("alone", name, args))
        if t.chain:
            kinds.append(ConformanceKind("chain", "+".join((name, *t.chain)), args))
    kept: list[tuple[str, ...]] = []
    for parts in sorted(drafted.values(), key=len, reverse=True):  # the longest chains first: they hold the others
        if not any(parts[0] in other for other in kept):
            kept.append(parts)
    for parts in (p for p in drafted.values() if p in kept):
        args = {k: v for n in parts for k, v in tests[n].method_args.items()}
        kinds.append(ConformanceKind("draft", "+".join((*parts, DRAFT)), args))
    return kinds


def register_proposer(
    name: str, test_args: ProposerTests | Mapping[str, Any] | None = DEFAULT_TESTS
) -> Callable[[type], type]:
    """Register a proposer that is not a model under ``name`` (a decorator on its class, a ``NamedProposer`` or
    any class with the ``Proposer`` protocol, one instance per generation): ``name``, ``name+draft`` and chains of
    named proposers (``name+other+draft``) become proposer kinds (``ProposerKind``). ``test_args``: what the
    exactness suites run it with (a ``ProposerTests``, or a dict of its fields; None: not under them, as a
    proposer a test registers to fail on purpose)."""
    try:
        tests = ProposerTests(**test_args) if isinstance(test_args, Mapping) else test_args
    except TypeError as err:  # a field it does not have
        raise ArgumentError(f"cannot register proposer {name!r}: test_args={test_args!r}: {err}") from None
    if tests is not None and not isinstance(tests, ProposerTests):
        raise ArgumentError(f"cannot register proposer {name!r}: test_args={test_args!r}, expected ProposerTests")

    def decorator(cls: type) -> type:
        if name in NAMED_PROPOSERS or name == DRAFT or not name.isidentifier():
            raise ArgumentError(f"cannot register proposer {name!r}: name taken or not a plain identifier")
        if tests is not None and name in tests.chain:
            raise ArgumentError(f"cannot register proposer {name!r}: its test_args chain names it")
        NAMED_PROPOSERS[name] = cls
        PROPOSER_TESTS[name] = tests
        return cls

    return decorator


@dataclass(frozen=True)
class ProposerKind:
    """A ``proposer`` value, parsed once (``parse_proposer``): named proposers asked in order, then, with
    ``draft``, the turn's own model (``lookup+draft``: prompt lookup where it matches, the model elsewhere)."""

    named: tuple[str, ...]
    draft: bool

    @property
    def text(self) -> str:
        return "+".join((*self.named, *((DRAFT,) if self.draft else ())))

    def classes(self) -> list[type]:
        return [NAMED_PROPOSERS[n] for n in self.named]

    @property
    def branches(self) -> bool:
        """Every part can give several candidates at a node (a token tree takes it)."""
        return all(capabilities(c).branches for c in self.classes())

    @property
    def feature_readers(self) -> tuple[str, ...]:
        """The parts that draft from the target's features (the first model needs a feature head)."""
        return tuple(n for n, c in zip(self.named, self.classes()) if capabilities(c).reads_features)

    @property
    def reads_features(self) -> bool:
        return bool(self.feature_readers)


def parse_proposer(text: object) -> ProposerKind:
    """The kind a ``proposer`` value names: registered names joined by ``+``, each once, ``draft`` only last
    (raises ArgumentError, one line, naming what is accepted)."""
    accepted = (
        f"{DRAFT}, a registered proposer ({', '.join(NAMED_PROPOSERS)}), or several joined by '+', {DRAFT} last "
        f"(lookup+{DRAFT}, suffix+recycle+{DRAFT})"
    )
    if not isinstance(text, str) or not text:
        raise ArgumentError(f"proposer={text!r}: expected {accepted}")
    names = text.split("+")
    draft = names[-1] == DRAFT
    named = tuple(names[:-1] if draft else names)
    bad = [n for n in named if n not in NAMED_PROPOSERS]
    if bad or len(set(named)) < len(named) or (not named and not draft):
        why = f"unknown proposer {bad[0]!r}" if bad else "a proposer named twice, or draft not last"
        raise ArgumentError(f"proposer={text!r}: {why}; expected {accepted}")
    return ProposerKind(named, draft)


class ModelProposer:
    """A model of the ensemble: samples the next token from its own warped logits (argmax if greedy).
    ``confident``: each proposal carries the largest probability of the model's distribution there as its
    confidence (the method's ``least_reach`` is above 0: a chain stops where the model is unsure, EAGLE-2's rule
    on a chain)."""

    def __init__(
        self,
        index: int,
        member: Member,
        sampling: Sampling,
        generator: torch.Generator | None,
        audit: Audit | None,
        confident: bool = False,
    ):
        self.index, self.member, self.sampling, self.generator, self.audit = index, member, sampling, generator, audit
        self.stats, self.confident = member.stats, confident

    def feed(self, tokens: list[int], committed: int) -> None:
        self.member.catch_up(tokens, committed)

    def draft(self, tokens: list[int], committed: int) -> Proposal | None:
        self.member.catch_up(tokens, committed)  # lazily feeds tokens another proposer added
        pos = len(tokens)
        row = self.member.span(pos, pos + 1)
        if self.audit is not None:
            self.audit.check(tokens, pos, pos + 1, [row], [self.index], single_model, self.sampling)
        sure = self.confident
        if self.sampling.greedy:
            top = row[0].softmax(dim=-1).max() if sure else None
            return Proposal(int(row[0].argmax()), None, self, confidence=None if top is None else float(top))
        q = probs(row, self.sampling)
        # its largest probability, never that of the token drawn: whether a position is drafted may not depend on
        # what is drawn there, or the drafted token would no longer follow q and the acceptance rule's proof fails
        top = float(q[0].max()) if sure else None
        return Proposal(int(sample(q, self.generator)[0]), q[0], self, confidence=top)


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
