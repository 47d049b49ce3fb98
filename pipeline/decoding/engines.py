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

Hooks that live above the decoder (a generation job's runs, vLLM's environment) are named by ``module:function``
and imported when called, as vLLM names a proposer class by its module path, so this table stands on the decoder's
floor and reaches no floor above it.

To add an engine (docs/extending.md, "Add an engine"):

1. Write its module (``pipeline/<engine>/``): a function ``runs(cell, stack) -> (run, tokenizer, prepared)`` as
   ``pipeline.job.generate.our_runs`` and ``pipeline.vllm.runs.vllm_runs`` are: ``run(prompt_ids, **settings)``
   returns one sample's tokens and stats, ``prepared(prompts)`` readies it and returns what made the samples
   (``provenance.provenance``); and, where it needs them, ``availability() -> str | None`` and
   ``unsupported(architectures) -> list[str]``.
2. Add its record to ``ENGINES`` below: its name, title, ``runs``, its methods (``PeerMethod``: the standard
   method each speeds up, what proposes, our method of the same job) and, where its decoding of the large model
   is a method of its own (vLLM's ``vllm``), that method as ``standard``.

Its methods then exist for the config (``pipeline grid`` lists them), are checked against a model set by the
same ``MethodSpec.check`` as ours, run in the generation job, and are set against ours in the report (``Ours over
other engines' methods``).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

DRAFT = "draft"  # the set's draft model proposes (``proposers.DRAFT``; this table stands below the proposers)


@dataclass(frozen=True)
class PeerMethod:
    """A method another engine brings: what it speeds up, what proposes and our method that does the same job."""

    base: str  # the standard method it speeds up (run beside it): ``large_model``, an ensemble, or the engine's own
    proposer: str  # what proposes: the set's draft (``draft``), prompt lookup (``lookup``), a feature head (``eagle``)
    ours: str  # our method that does the same job (set against it in the report)
    not_exact: str | None = None  # why its samples at T > 0 are not its standard method's distribution (measured)
    speculator: str | None = None  # the engine's own name for it (vLLM's ``speculative_config`` method)


@dataclass(frozen=True, eq=False)  # one record per engine: compared by identity
class Engine:
    name: str  # the key, as a cell's provenance names it
    title: str  # as messages name it
    runs: str  # ``module:function`` (cell, stack) -> (run, tokenizer, prepared): how a generation job runs a cell
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
    available: str | None = None  # ``module:function`` () -> None or one line why it cannot run here
    unsupported: str | None = None  # ``module:function`` (architectures) -> those it has no model class for
    environment: str | None = None  # its environment's record under the results root (its own rule builds it)
    head_problem: str | None = None  # ``module:function`` (its speculator, model name, eagle entry) -> why it cannot
    # run that head

    def __reduce__(self):  # a copy or an unpickled one is the table's record (compared by identity)
        return engine_named, (self.name,)

    def runner(self) -> Callable:
        """How a generation job runs a cell with this engine (``runs``, imported now)."""
        return hook(self.runs)

    def availability(self) -> str | None:
        """None where the engine can run here; else why not, in one line."""
        return hook(self.available)() if self.available else None

    def cannot_load(self, architectures: list[str]) -> list[str]:
        """Those of a model's ``architectures`` (config.json) this engine has no model class for."""
        return hook(self.unsupported)(architectures) if self.unsupported else []

    def feature_head_problem(self, method: str, name: str, entry: Any) -> str | None:
        """Why this engine's ``method`` cannot run model ``name``'s feature head (its config ``eagle`` entry), or
        None."""
        return hook(self.head_problem)(self.methods[method].speculator, name, entry) if self.head_problem else None


def engine_named(name: str) -> Engine:
    """The table's record of the engine ``name``."""
    return ENGINES[name]


def hook(path: str) -> Callable:
    """The function a record names as ``module:function``."""
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)


# vLLM's CPU build's one bug behind its inexact speculation at T > 0 (vLLM issue #55005): the shim that stands in
# for the Triton kernel ``expand_kernel`` hands the int64-only C++ kernel an int64 copy of its output and discards
# it, so the rejection sampler divides the target's logits by uninitialised memory as their temperature (and
# truncates top-p). ``vllm_*_pr55006`` run vLLM with only that shim corrected in their worker, as the upstream fix
# (vLLM PR #55006, open) does: the behaviour of vLLM's speculation once exact (worker.py)
PR55006 = "_pr55006"
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
                "pipeline.job.generate:our_runs",
                unions=True,
                restricted_heads=True,
            ),
            Engine(  # transformers' own speculative methods (peers.py), run by generate beside ours
                "transformers",
                "transformers' generate",
                "pipeline.job.generate:our_runs",
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
                "pipeline.vllm.runs:vllm_runs",
                methods={
                    **_VLLM_SPECULATION,
                    **{f"{name}{PR55006}": replace(m, not_exact=None) for name, m in _VLLM_SPECULATION.items()},
                },
                standard="vllm",  # vLLM's autoregressive decoding of the set's first model
                peer_kind="vllm_peer",
                reference="large_model",  # vLLM's decoding draws the large model's tokens
                method_args={"eager": True},  # vLLM's CUDA graphs / torch.compile off (docs/vllm.md: the budgets)
                elsewhere="in vLLM's own environment, through a grid cell's generation job (pipeline/vllm)",
                drafting="vLLM's draft-model speculation",
                available="pipeline.vllm.env:availability",
                unsupported="pipeline.vllm.env:unsupported",
                environment="envs/vllm.json",
                head_problem="pipeline.vllm.eagle:entry_problem",
            ),
        )
    }
)
OURS = ENGINES["ours"]
