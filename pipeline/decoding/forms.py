"""A method's forms, in one table: what a method name's suffix makes of an ensemble, and the kinds of the methods
that are not an ensemble's (``spec.py`` parses names from it, lists them and reads each property of a method
from its form; ``register_ensemble`` refuses an ensemble name that ends in a suffix)."""

from __future__ import annotations

from dataclasses import dataclass

from .engines import ENGINES


@dataclass(frozen=True)
class Form:
    kind: str  # MethodSpec.kind, as a cell's dimensions record it
    suffix: str | None = None  # an ensemble's name + suffix names this form (None: not an ensemble's form)
    speculative: bool = False  # proposes and verifies: takes gamma
    own_loop: bool = False  # speculates in our own loop: a dynamic gamma schedule and a token tree apply
    in_turn: bool = False  # every model proposes in turn: one gamma per model
    mixture: bool = False  # draws one member per position (only a mixture ensemble has this form)
    parallel: bool = False  # the members' forwards run concurrently
    peer: bool = False  # another engine's method, run beside ours (its engine's record: ``engines.py``)


FORMS = (
    Form("plain", ""),  # the ensemble itself; also large_model and small_model
    Form("parallel", "_p", parallel=True),
    Form("sd", "_sd", speculative=True, own_loop=True),  # one proposer, the others verify; also sd
    Form("se", "_se", speculative=True, own_loop=True, in_turn=True),
    Form("me", "_me", mixture=True),
    Form("me_sd", "_me_sd", speculative=True, mixture=True),
    # each other engine's methods, of the kind its record names (transformers' ``peer``, vLLM's ``vllm_peer``)
    *(Form(engine.peer_kind, speculative=True, peer=True) for engine in ENGINES.values() if engine.peer_kind),
)
KINDS = {form.kind: form for form in FORMS}
SUFFIXES = tuple(form.suffix for form in FORMS if form.suffix)  # reserved: no ensemble's name ends in one


def ensemble_forms(mixture: bool) -> tuple[Form, ...]:
    """The forms an ensemble takes, in the order names are listed (a mixture's only for a mixture ensemble)."""
    return tuple(form for form in FORMS if form.suffix is not None and (mixture or not form.mixture))


def split(name: str) -> tuple[str, Form]:
    """A name as ``(ensemble name, form)``, by its longest suffix (``we_me_sd``: ``we``, ``me_sd``)."""
    for form in sorted((f for f in FORMS if f.suffix), key=lambda f: -len(f.suffix)):
        if name.endswith(form.suffix):
            return name[: -len(form.suffix)], form
    return name, KINDS["plain"]
