"""Method names, parsed once: what a method is and what it needs of a model set.

A name is ``large_model``, ``small_model``, ``sd``, a registered ensemble ``E`` or one of its forms (``forms.py``:
``E_p``, ``E_sd``, ``E_se``, and for a mixture ensemble ``E_me``, ``E_me_sd``; ``MethodSpec.form`` says what each
does), or a peer, another engine's method run beside ours (``PEERS``): transformers' own speculative methods
(``hf_*``, ``peers.py``), and vLLM's decoding (``vllm``) and speculation (``vllm_*``), which run in vLLM's own
environment through a generation job (``pipeline/vllm``), never in :func:`generate`. The
decoder and the workflow both check a method against a model set with :meth:`MethodSpec.check`, so the two never
disagree; each method's contract is in ``docs/algorithms.md``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ..errors import ArgumentError
from .engines import ENGINES, OURS, Engine
from .ensembles import ENSEMBLES, Ensemble
from .forms import KINDS, Form, ensemble_forms, split
from .proposers import DRAFT, NAMED_PROPOSERS, parse_proposer

SINGLE_METHODS = ("large_model", "small_model")
# other engines' methods (``engines.py``: each engine's record lists its own): name -> what it speeds up, what
# proposes and our method of the same job; and the engine that runs each, and the engines' own standard methods
PEERS = {name: method for engine in ENGINES.values() for name, method in engine.methods.items()}
PEER_ENGINES = {name: engine for engine in ENGINES.values() for name in engine.methods}
STANDARDS = {engine.standard: engine for engine in ENGINES.values() if engine.standard}  # vLLM's ``vllm``
# peers whose samples at T > 0 are not their standard method's distribution, measured (docs/exactness.md,
# docs/vllm.md): why
NOT_EXACT_SAMPLING = {name: method.not_exact for name, method in PEERS.items() if method.not_exact}


def is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def proposer_kinds() -> tuple[str, ...]:
    """The ``proposer`` values each proposer gives: ``draft`` (the models), and each named proposer
    (``register_proposer``) alone and chained before the models (``lookup+draft``: ``+`` chains proposers, the
    first that proposes wins). Longer chains of named proposers (``suffix+recycle+draft``) are accepted too
    (``proposers.parse_proposer``)."""
    return (DRAFT, *NAMED_PROPOSERS, *(f"{name}+{DRAFT}" for name in NAMED_PROPOSERS))


@dataclass(frozen=True)
class MethodSpec:
    name: str
    base: str  # the method it is or speeds up: large_model, small_model or an ensemble's name
    form: Form  # what it does (forms.py): its kind and the properties below
    ensemble: Ensemble | None = None
    engine: Engine = field(default=OURS, repr=False)  # what decodes it (engines.py): ours, transformers' or vLLM

    @property
    def kind(self) -> str:
        return self.form.kind

    @property
    def speculative(self) -> bool:
        """Proposes and verifies: takes gamma (and, but for the peers, a proposer)."""
        return self.form.speculative

    @property
    def own_loop(self) -> bool:
        """Speculates in our own loop (``sd``, ``E_sd``, ``E_se``): a dynamic gamma schedule and a token tree
        apply (the peers run transformers' loop; a mixture's drafter drafts runs of positions)."""
        return self.form.own_loop

    @property
    def in_turn(self) -> bool:
        """Every model proposes in turn (``E_se``): it takes one gamma per model."""
        return self.form.in_turn

    @property
    def peer(self) -> bool:
        """Another engine's method (transformers' ``hf_*``, vLLM's ``vllm_*``), run beside ours."""
        return self.form.peer

    def exact_at(self, temperature: float) -> bool:
        """Whether its samples follow its standard method's distribution at ``temperature`` (greedy: every method
        here emits its standard method's tokens; sampling: all but the peers in ``NOT_EXACT_SAMPLING``)."""
        return temperature == 0 or self.name not in NOT_EXACT_SAMPLING

    @property
    def peer_corrected(self) -> str | None:
        """For a peer method: the engine's bug its worker corrects (its record's ``corrected``: vLLM's CPU build's
        ``expand_kernel`` shim, ``vllm_*_pr55006``), as messages name it; None: the engine as released."""
        return PEERS[self.name].corrected if self.peer else None

    @property
    def mixture(self) -> bool:
        """Draws one member per position, the token from it alone (``E_me``, ``E_me_sd``)."""
        return self.form.mixture

    @property
    def parallel(self) -> bool:
        """The standard ensemble with the members' forwards run concurrently (``E_p``)."""
        return self.form.parallel

    @property
    def greedy_ok(self) -> bool:
        """Defined at temperature 0: a mixture draw has no greedy form (argmax r is no member's argmax)."""
        return not self.mixture

    @property
    def baseline(self) -> str | None:
        """The standard method it speeds up (run beside it, side by side); None for a standard method."""
        return self.base if self.form is not KINDS["plain"] else None  # ``vllm`` is plain: the standard

    @property
    def standard(self) -> str | None:
        """What a cell's speed is compared with: the standard method it speeds up (itself for an ensemble)."""
        return self.baseline or (self.name if self.ensemble is not None else None)

    @property
    def family(self) -> str:
        """The ensemble it runs, or ``single`` (one model of the set, or ``sd`` and its peers)."""
        return self.base if self.ensemble is not None else "single"

    @property
    def proposer_kinds(self) -> tuple[str, ...]:
        """The ``proposer`` values it takes: a mixture's drafter must sample its own positions, so a model."""
        if not self.speculative or self.peer:
            return ()
        return (DRAFT,) if self.mixture else proposer_kinds()

    def check_temperature(self, temperature: float) -> None:
        """Raise ArgumentError (one line) for a temperature this method cannot sample at."""
        if temperature == 0 and not self.greedy_ok:
            raise ArgumentError(
                f"temperature={temperature!r} for {self.name!r}: a mixture draw needs sampling; expected a "
                f"temperature > 0 (greedy decoding of this ensemble is {self.base!r})"
            )

    def accepted_args(self) -> dict[str, Any]:
        """The ``method_args`` this method takes, with their defaults."""
        accepted = dict(self.ensemble.params) if self.ensemble else {}
        accepted |= self.engine.method_args  # vLLM's: eager (docs/vllm.md: eager fits the budgets here)
        if self.proposer_kinds:
            accepted["proposer"] = DRAFT
            accepted["least_reach"] = 0.0
            if self.ensemble:
                accepted["first_proposer"] = None
        return accepted

    def model_range(self, proposer: str = DRAFT) -> tuple[int, int | None]:
        """The fewest and most models (None: no limit) a set may hold."""
        if self.peer:  # [target, draft]; prompt lookup runs the first model alone
            return (2, 2) if self.peer_proposer == DRAFT else (1, 2)
        if self.ensemble is not None:
            return self.ensemble.min_models, self.ensemble.max_models
        if self.name == "sd":  # [target, draft]; a named proposer alone needs no draft
            return (2, 2) if parse_proposer(proposer).draft else (1, 2)
        return 1, None

    def check_heads(self, heads: Sequence[int]) -> None:
        """Another engine's draft-model speculation (a peer with a draft: transformers' assisted generation, vLLM's
        ``draft_model``) needs the target's and the draft's heads of one size; our methods crop heads padded past a
        shared tokenizer (``vocab_size``) and run any such set."""
        if self.peer_proposer == DRAFT and len(set(heads)) > 1:
            raise ArgumentError(
                f"{self.name!r} runs {self.engine.drafting}, which needs heads of one size "
                f"(these have {', '.join(map(str, heads))} rows); our own methods crop the padding and run this set"
            )

    @property
    def peer_proposer(self) -> str | None:
        """What proposes for a peer method: ``draft`` (the set's second model), ``lookup`` or ``eagle``."""
        return PEERS[self.name].proposer if self.peer else None

    @property
    def peer_speculator(self) -> str | None:
        """The engine's own name for a peer method's speculation (vLLM's ``speculative_config`` method)."""
        return PEERS[self.name].speculator if self.peer else None

    @property
    def peer_reads_features(self) -> bool:
        """A peer method whose proposer drafts from the first model's feature head (``vllm_eagle``,
        ``vllm_eagle3``: the proposer's declared ``reads_features``)."""
        return self.peer and parse_proposer(self.peer_proposer).reads_features

    @property
    def ours(self) -> str | None:
        """For a peer method: our method that does the same job (``sd`` for assisted generation, ``vllm_sd``)."""
        return PEERS[self.name].ours if self.peer else None

    def fits(self, n: int, proposer: str = DRAFT) -> bool:
        low, high = self.model_range(proposer)
        return low <= n and (high is None or n <= high)

    def check(self, n: int, method_args: dict[str, Any], restricted: Sequence[str] = ()) -> dict[str, Any]:
        """Check this method and its ``method_args`` against a set of ``n`` models; return the resolved args.

        ``restricted`` names the models whose output head covers part of the
        vocabulary (distilled drafts). Raises ArgumentError, one line.
        """
        accepted = self.accepted_args()
        unknown = sorted(set(method_args) - set(accepted))
        if unknown:
            keys = ", ".join(sorted(accepted)) or "none"
            raise ArgumentError(f"unknown method_args {unknown} for {self.name!r}; accepted: {keys}")
        resolved = {**accepted, **method_args}
        proposer = resolved.get("proposer", DRAFT)
        if self.proposer_kinds:
            try:
                kind = parse_proposer(proposer)
            except ArgumentError as err:
                raise ArgumentError(f"{err} (method {self.name!r})") from None
            if self.mixture and kind.named:
                kinds = ", ".join(self.proposer_kinds)
                raise ArgumentError(f"proposer={proposer!r} for {self.name!r}: expected one of {kinds}")
        if not self.fits(n, proposer):
            low, high = self.model_range(proposer)
            want = str(low) if low == high else f"{low} to {high}" if high else f"{low} or more"
            given = f" with proposer={proposer!r}" if self.model_range(proposer) != self.model_range() else ""
            raise ArgumentError(f"{self.name!r}{given} needs {want} models, got {n}")
        if self.peer_proposer == DRAFT and restricted and not self.engine.restricted_heads:
            raise ArgumentError(
                f"{self.name!r} runs {self.engine.title}, which cannot take the restricted output head of model "
                f"{restricted[0]} (a distilled draft); use a draft with a full head ('full_head: true' in a config)"
            )
        if self.ensemble is not None and self.ensemble.full_vocab and restricted:
            raise ArgumentError(
                f"{self.name!r} needs full-vocabulary logits, but model {restricted[0]} has a restricted output head "
                "(a distilled draft); use one with a full head ('full_head: true' in a config)"
            )
        if not isinstance(resolved.get("eager", True), bool):  # "no" is not False: bool("no") would run eager
            raise ArgumentError(f"eager={resolved['eager']!r} for {self.name!r}: expected true or false")
        least = resolved.get("least_reach", 0.0)
        if isinstance(least, bool) or not isinstance(least, (int, float)) or not 0.0 <= least <= 1.0:  # NaN fails
            raise ArgumentError(
                f"least_reach={least!r} for {self.name!r}: expected a number in 0..1 (a chain stops before a proposal "
                "whose reach, the product of its proposers' confidences, falls below it; 0: never)"
            )
        first = resolved.get("first_proposer")
        if first is not None and (not is_int(first) or not 0 <= first < n):
            raise ArgumentError(f"first_proposer={first!r} for {self.name!r}: expected 0..{n - 1} (a model index)")
        if self.ensemble is not None and self.ensemble.check is not None:
            params = {k: resolved.pop(k) for k in self.ensemble.params}
            try:
                params = self.ensemble.check(params, n)
            except ValueError as err:
                raise ArgumentError(f"method_args for {self.name!r}: {err}") from None
            resolved = {**{k: v for k, v in params.items() if k in self.ensemble.params}, **resolved}
        if self.peer and self.ensemble is not None and not 0.0 < resolved["weights"][0] < 1.0:
            raise ArgumentError(
                f"weights={resolved['weights']} for {self.name!r}: transformers' assistant_ensemble_weight "
                "(the first weight, 1 - lambda) must lie strictly between 0 and 1"
            )
        return resolved


def method_names() -> list[str]:
    """Every accepted method name, registered ensembles included."""
    names = [*SINGLE_METHODS, "sd", *STANDARDS]
    for name, ensemble in ENSEMBLES.items():
        names += [name + form.suffix for form in ensemble_forms(ensemble.mixture)]
    return names + list(PEERS)


def parse_method(name: str) -> MethodSpec:
    """The spec of a method name (raises ArgumentError for an unknown one)."""
    if name in SINGLE_METHODS:
        return MethodSpec(name, name, KINDS["plain"])
    if name in STANDARDS:  # an engine's own decoding of the set's first model (vLLM's ``vllm``)
        return MethodSpec(name, name, KINDS["plain"], engine=STANDARDS[name])
    if name == "sd":
        return MethodSpec(name, "large_model", KINDS["sd"])
    if name in PEERS:
        engine, base = PEER_ENGINES[name], PEERS[name].base
        return MethodSpec(name, base, KINDS[engine.peer_kind], ENSEMBLES.get(base), engine)
    base, form = split(name)
    if base not in ENSEMBLES or form not in ensemble_forms(ENSEMBLES[base].mixture):
        raise ArgumentError(f"unknown method {name!r}; accepted: {', '.join(method_names())}")
    return MethodSpec(name, base, form, ENSEMBLES[base])


def accepted_args(method: str) -> dict[str, Any]:
    """The ``method_args`` a method takes, with their defaults (raises ValueError for an unknown method)."""
    return parse_method(method).accepted_args()
