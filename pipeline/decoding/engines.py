"""The decoding engines, one record each, in one table (``ENGINES``): what decodes a method.

Three engines decode a cell: our decoder (every method of ours, ``generate``), transformers' ``generate`` (its own
speculative methods, ``hf_*``, run beside ours through ``peers.py``) and vLLM (its decoding ``vllm`` and speculation
``vllm_*``, in vLLM's own environment, ``pipeline/vllm``). A record says all the rest of the project asks of an
engine: how a generation job runs a cell (``runs``), whether the engine can run here (``availability``: one line
why not), which models it cannot load (``cannot_load``), the methods it brings (``methods``: each with the standard
method it speeds up, its proposer and the method of ours that does the same job), the method that its tokens are
checked against in float64 (``reference``), the ``method_args`` its methods take, what it cannot decode (models of
different tokenizers, a distilled draft's restricted head) and the name messages use. A method's engine is parsed
once with its name (``spec.parse_method``: ``MethodSpec.engine``); no module compares an engine's name but this
one (``tests/test_structure.py`` refuses it elsewhere).

What an engine does lives above the decoder, in its own module of ``pipeline/engines/`` reached by plain imports
(``ours.py``, ``transformers.py``, ``vllm.py``): how a generation job runs a cell (``runs``, returning a ``Runs``,
below), whether the engine can run here, which models it cannot load, which feature heads it cannot run. This
table holds the facts only, so it stands on the decoder's floor and names nothing above it.

To add an engine (docs/extending.md, "Add an engine"):

1. Add its record to ``ENGINES`` below: its name, title, its methods (``PeerMethod``: the standard method each
   speeds up, what proposes, our method of the same job) and, where its decoding of the large model is a method
   of its own (vLLM's ``vllm``), that method as ``standard``.
2. Write its behaviour, ``pipeline/engines/<name>.py``: a ``Behaviour`` whose ``runs(cell, stack) -> Runs`` readies
   the cell's models (``run(prompt_ids, method, **settings)`` returns one sample's ``GenerationResult``;
   ``prepare(prompts)`` readies it and returns what made the samples, ``provenance.provenance``) and, where it
   needs them, ``availability``, ``cannot_load`` and ``head_problem``; name it in ``pipeline/engines/__init__.py``.

Its methods then exist for the config (``pipeline grid`` lists them), are checked against a model set by the
same ``MethodSpec.check`` as ours, run in the generation job, and are set against ours in the report (``Ours over
other engines' methods``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any, Protocol

from .corpus import Corpus

DRAFT = "draft"  # the set's draft model proposes (``proposers.DRAFT``; this table stands below the proposers)


@dataclass(frozen=True)
class PeerMethod:
    """A method another engine brings: what it speeds up, what proposes and our method that does the same job."""

    base: str  # the standard method it speeds up (run beside it): ``large_model``, an ensemble, or the engine's own
    proposer: str  # what proposes: the set's draft (``draft``), prompt lookup (``lookup``), a feature head (``eagle``)
    ours: str  # our method that does the same job (set against it in the report)
    not_exact: str | None = None  # why its samples at T > 0 are not its standard method's distribution (measured)
    speculator: str | None = None  # the engine's own name for it (vLLM's ``speculative_config`` method)
    corrected: str | None = None  # a bug of the engine's that its worker corrects for it (the upstream fix it
    # applies, as messages name it); None: the engine as released


@dataclass(frozen=True, eq=False)  # one record per engine: compared by identity
class Engine:
    name: str  # the key, as a cell's provenance names it
    title: str  # as messages name it
    methods: Mapping[str, PeerMethod] = field(default_factory=dict)  # the methods it brings (none: ours)
    standard: str | None = None  # its own decoding of the set's first model, a method of its own (the baseline
    # of its speculation); None: it decodes our standard methods
    peer_kind: str | None = None  # the kind (``forms.py``) of its methods, as a cell's dimensions record it
    reference: str | None = None  # the method of ours whose float64 target its tokens are checked against (None:
    # the method's own plan)
    method_args: Mapping[str, Any] = field(default_factory=dict)  # what every method of it takes, with defaults
    elsewhere: str | None = None  # where its methods run when not in ``generate`` (None: ``generate`` runs them)
    unions: bool = False  # decodes models of different tokenizers over the union of their vocabularies
    restricted_heads: bool = False  # takes a distilled draft's restricted output head
    drafting: str | None = None  # its draft-model speculation, as messages name it
    environment: str | None = None  # its environment's record under the results root (its own rule builds it)

    def __reduce__(self):  # a copy or an unpickled one is the table's record (compared by identity)
        return engine_named, (self.name,)


def engine_named(name: str) -> Engine:
    """The table's record of the engine ``name``."""
    return ENGINES[name]


# vLLM's CPU build's one bug behind its inexact speculation at T > 0 (vLLM issue #55005): the shim that stands in
# for the Triton kernel ``expand_kernel`` hands the int64-only C++ kernel an int64 copy of its output and discards
# it, so the rejection sampler divides the target's logits by uninitialised memory as their temperature (and
# truncates top-p). ``vllm_*_pr55006`` run vLLM with only that shim corrected in their worker, as the upstream fix
# (vLLM PR #55006, open) does: the behaviour of vLLM's speculation once exact (worker.py)
PR55006 = "_pr55006"  # the name's suffix of those methods
EXPAND_FIX = "its expand_kernel shim corrected (vLLM #55005)"  # as a cell's provenance says it
CPU_EXPAND = (
    "vLLM's CPU build divides the target's logits by uninitialised memory as temperature (its expand_kernel shim "
    "discards its output: vLLM issue #55005; fix PR #55006, open; the *_pr55006 variant applies it)"
)
# Verifying a sampled draft token as if one-hot (accept with r(x), else draw from r without x) is exact, only less
# accepting: vllm_sd's inexactness is the CPU build's, as that of lookup's and EAGLE's drafts (docs/vllm.md)
_VLLM_SPECULATION = {
    "vllm_sd": PeerMethod("vllm", DRAFT, "sd", CPU_EXPAND, "draft_model"),  # vLLM's draft-model speculation
    "vllm_ngram": PeerMethod("vllm", "lookup", "sd", CPU_EXPAND, "ngram"),  # prompt lookup (n-grams 2 to 4)
    "vllm_eagle": PeerMethod("vllm", "eagle", "sd", CPU_EXPAND, "eagle"),  # EAGLE-1: the first model's head
    "vllm_eagle3": PeerMethod("vllm", "eagle", "sd", CPU_EXPAND, "eagle3"),  # EAGLE-3: the first model's head
}

ENGINES: Mapping[str, Engine] = MappingProxyType(
    {
        engine.name: engine
        for engine in (
            Engine(
                "ours",
                "our decoder",
                unions=True,
                restricted_heads=True,
            ),
            Engine(  # transformers' own speculative methods (peers.py), run by generate beside ours
                "transformers",
                "transformers' generate",
                methods={
                    "hf_assisted": PeerMethod("large_model", DRAFT, "sd"),
                    "hf_prompt_lookup": PeerMethod("large_model", "lookup", "sd"),
                    "hf_assisted_ensemble": PeerMethod(
                        "we",
                        DRAFT,
                        "we_sd",
                        "transformers draws a fully accepted block's next token from the target alone",
                    ),
                },
                peer_kind="peer",
                drafting="transformers' assisted generation",
            ),
            Engine(  # vLLM (pipeline/vllm): workers in vLLM's own environment, through a grid cell's generation job
                "vllm",
                "vLLM",
                methods={
                    **_VLLM_SPECULATION,
                    **{
                        f"{name}{PR55006}": replace(m, not_exact=None, corrected=EXPAND_FIX)
                        for name, m in _VLLM_SPECULATION.items()
                    },
                },
                standard="vllm",  # vLLM's autoregressive decoding of the set's first model
                peer_kind="vllm_peer",
                reference="large_model",  # vLLM's decoding draws the large model's tokens
                method_args={"eager": True},  # vLLM's CUDA graphs / torch.compile off (docs/vllm.md: the budgets)
                elsewhere="in vLLM's own environment, through a grid cell's generation job (pipeline/vllm)",
                drafting="vLLM's draft-model speculation",
                environment="envs/vllm.json",
            ),
        )
    }
)
OURS = ENGINES["ours"]


class RunsCell(Protocol):
    """What an engine's ``runs`` reads of a grid cell (``experiment/cell.py``'s ``Cell`` is one)."""

    method: str
    models: Sequence[Any]  # the set's ``ModelSpec``s, the first the target
    method_args: Mapping[str, Any]
    tree: str | None
    max_new_tokens: int

    def sampling(self) -> dict[str, Any]: ...


@dataclass(frozen=True)
class Runs:
    """What an engine hands a generation job for one cell (its ``runs(cell, stack)``): the contract between them."""

    run: Callable[..., Any]  # (prompt_ids, method, **settings) -> one sample's ``GenerationResult`` (methods.py)
    tokenizer: Any  # the first model's: prompts are its ids
    prepare: Callable[[dict[str, list[int]]], dict[str, Any]]  # readies the runs for the prompts; what made them
    vocab: int  # a sample's ids are below it (the union's size where the set's tokenizers differ)
    text: Callable[[list[int]], str]  # the output a sample's ids make, as the job writes it
    corpus: Corpus | None = None  # the job's corpus, read by its proposers (``suffix``, ``recycle``)
    pids: Callable[[], Iterable[int]] = tuple  # processes whose time counts as the job's (vLLM's workers)
