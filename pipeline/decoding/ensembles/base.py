"""The ensembles' registry and contract: an ensemble function gives the target distribution ``r`` from every
member's logits; each registered one is a module of this folder (``we.py``, ``cd.py``, ``gac.py``).

An ensemble function maps the list of member logits (each ``[k, V]``, in the
method's model order), the sampling settings and its own parameters to a
probability tensor ``[k, V]``. Greedy decoding calls it with
``Sampling.identity()`` and takes the argmax, so greedy never falls back to one
model's argmax.

Register a new one with ``register_ensemble`` in a module dropped in this folder (``docs/extending.md``): it is
imported with the package, and its methods exist at once. One registered with ``mixture=True`` promises that its
function is ``r = sum_k w_k softmax(warp(l_k))`` with ``w`` its resolved
``weights`` parameter: then ``r`` can be sampled as a mixture (``<name>_me``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from ...errors import ArgumentError
from ..forms import SUFFIXES
from ..sampling import Sampling, probs

EnsembleFn = Callable[..., Tensor]


def finite(x: Any) -> bool:
    """A finite real number (not a bool, not NaN, not infinite): what every numeric parameter must be."""
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


@dataclass(frozen=True)
class Ensemble:
    name: str
    fn: EnsembleFn
    params: dict[str, Any] = field(default_factory=dict)  # accepted parameters and defaults
    min_models: int = 2
    max_models: int | None = None
    check: Callable[[dict[str, Any], int], dict[str, Any]] | None = None  # validate/normalise
    full_vocab: bool = False  # needs every member's logits over the whole vocabulary
    mixture: bool = False  # r = sum_k weights[k] * softmax(warp(l_k)): sampled as a mixture by <name>_me
    # the arguments the exactness tests run it with (any number of models it takes); None: not under them (an
    # ensemble a test registers to fail on purpose)
    test_args: dict[str, Any] | None = field(default_factory=dict)


ENSEMBLES: dict[str, Ensemble] = {}


def conformance_ensembles() -> dict[str, dict[str, Any]]:
    """Every registered ensemble the exactness tests run (greedy identity, chi-square sampling, the audit, trees),
    with the arguments it declared for them: registering one puts its methods under every test, no test edited."""
    return {name: dict(e.test_args) for name, e in ENSEMBLES.items() if e.test_args is not None}


def register_ensemble(name: str, **options: Any) -> Callable[[EnsembleFn], EnsembleFn]:
    """Register an ensemble function under ``name`` (a decorator); ``options`` are ``Ensemble``'s fields."""

    def decorator(fn: EnsembleFn) -> EnsembleFn:
        if name in ENSEMBLES or name.endswith(SUFFIXES) or not name.isidentifier():
            raise ArgumentError(f"cannot register ensemble {name!r}: name taken or not a plain identifier")
        if options.get("mixture") and "weights" not in options.get("params", {}):
            raise ArgumentError(f"cannot register ensemble {name!r} as a mixture: it takes no 'weights'")
        ENSEMBLES[name] = Ensemble(name, fn, **options)
        return fn

    return decorator


def check_weights(args: dict[str, Any], n_models: int) -> dict[str, Any]:
    """An ensemble's ``weights`` (or, for two models, ``lambda``: the second's weight) checked and normalised to sum
    to 1; equal weights where neither is given. Every ensemble that weighs its members takes these."""
    lam, weights = args.pop("lambda", None), args.get("weights")
    if lam is not None:
        if weights is not None:
            raise ArgumentError("give either 'lambda' or 'weights' for a weighted ensemble, not both")
        if n_models != 2:
            raise ArgumentError(f"'lambda' needs exactly 2 models, got {n_models}; use 'weights' for {n_models}")
        if not finite(lam) or not 0.0 <= lam <= 1.0:
            raise ArgumentError(f"lambda={lam!r} is outside the accepted range [0, 1]")
        weights = [1.0 - lam, float(lam)]
    if weights is None:
        weights = [1.0 / n_models] * n_models
    if (
        not isinstance(weights, (list, tuple))
        or len(weights) != n_models
        or any(not finite(w) or w < 0 for w in weights)
    ):
        raise ArgumentError(f"weights={weights!r}: expected {n_models} finite non-negative numbers, one per model")
    total = float(sum(weights))
    if not 0 < total < math.inf:
        raise ArgumentError(f"weights={weights!r}: their sum must be positive and finite")
    args["weights"] = [float(w) / total for w in weights]
    return args


class EnsembleOutputError(ArgumentError):
    """An ensemble function (or a runner) gave the decoder something that is not a distribution."""


def target_name(fn: Callable) -> str:
    """The name an ensemble function is known by (its registered name; a partial's function's name)."""
    fn = getattr(fn, "func", fn)
    named = next((e.name for e in ENSEMBLES.values() if e.fn is fn), None)
    return named or getattr(fn, "__name__", repr(fn))


def check_output(
    out: Any,
    fn: Callable,
    step: int,
    rows: int,
    vocab: int,
    logits: bool = False,
    inputs: Sequence[Tensor] = (),
    sampling: Sampling | None = None,
) -> Tensor:
    """``out`` if it is a ``[rows, vocab]`` floating tensor whose every row has a finite positive mass, no
    negative entry and no NaN; else a one-line ``EnsembleOutputError`` naming the ensemble and the step. Two
    reductions (the row sums: NaN if any entry is NaN, -inf or 0 when no entry has mass; the row minima), one
    host sync. ``logits``: ``out`` holds logits (a row needs a finite maximum and no NaN: the row maxima, NaN
    where a row has one). ``inputs`` (the members' logits rows) and ``sampling``, where given, tell on failure
    whether the settings rather than the ensemble made the fault (``_settings_fault``)."""
    said = f"ensemble {target_name(fn)!r} at step {step} returned"
    if not isinstance(out, Tensor):
        raise EnsembleOutputError(f"{said} a {type(out).__name__}, expected a tensor")
    if tuple(out.shape) != (rows, vocab):
        raise EnsembleOutputError(
            f"{said} shape {tuple(out.shape)}, expected ({rows}, {vocab}): one row per position over the models' "
            f"vocabulary of {vocab}"
        )
    if not out.is_floating_point():
        raise EnsembleOutputError(f"{said} dtype {out.dtype}, expected a floating tensor")
    if logits:  # a finite maximum per row (NaN where a row holds one)
        ok = all(-math.inf < top < math.inf for top in out.amax(dim=-1).tolist())
    else:  # a finite positive mass per row (NaN where a row holds one, -inf or 0 where no entry has mass) and
        # no negative entry (a row with one is no distribution, whatever its sum): one host sync for both
        totals, lows = torch.stack([out.sum(dim=-1), out.amin(dim=-1)]).tolist()
        ok = all(0 < total < math.inf and low >= 0 for total, low in zip(totals, lows))
    if not ok:
        raise EnsembleOutputError(f"{said} {_fault(out, logits)}{_settings_fault(fn, inputs, sampling)}")
    return out


def check_rows(rows: Any, runner: Any, keep: int) -> Tensor:
    """A runner's logits rows if they are ``[keep, vocab]`` floating rows (shape and dtype only: no reduction;
    their values meet ``check_output`` in the target); else a one-line ``EnsembleOutputError``."""
    vocab = getattr(runner, "vocab_size", None)
    shape = tuple(rows.shape) if isinstance(rows, Tensor) else None
    if shape is None or len(shape) != 2 or shape[0] != keep or (vocab is not None and shape[1] != vocab):
        raise EnsembleOutputError(
            f"runner {type(runner).__name__} returned {shape or type(rows).__name__} logits rows, expected "
            f"({keep}, {vocab if vocab is not None else 'V'})"
        )
    if not rows.is_floating_point():
        raise EnsembleOutputError(f"runner {type(runner).__name__} returned {rows.dtype} logits rows, expected float")
    return rows


def _fault(out: Tensor, logits: bool) -> str:
    """What is wrong with a distribution that failed ``check_output`` (only computed on failure)."""
    if bool(torch.isnan(out).any()):
        return "NaN entries"
    if bool((~torch.isfinite(out).any(dim=-1)).any()):
        return "no finite entry in a row"
    if bool((out < 0).any()) and not logits:
        return "negative entries (expected probabilities >= 0)"
    return "a row with no positive finite mass (expected probabilities, not all zero)"


def _settings_fault(fn: Callable, inputs: Sequence[Tensor], sampling: Sampling | None) -> str:
    """Where the members' logits were all finite and the fault is the settings', what to blame instead of the
    ensemble: a temperature so near 0 that the warped logits leave the floating-point range (recomputed), or a
    parameter of extreme size (1e30 or more, 1e-30 or less). Only computed on failure."""
    if not inputs or not all(_sound(row) for row in inputs):
        return ""
    warped = sampling is not None and not sampling.greedy
    if warped and not all(_sound(probs(row, sampling)) for row in inputs):
        return (
            f" from finite logits: temperature={sampling.temperature!r} takes the logits divided by it beyond "
            "the floating-point range; use 0 for greedy decoding or a temperature of 1e-3 or more"
        )
    extreme = {
        k: v
        for k, v in getattr(fn, "keywords", {}).items()
        if isinstance(v, (int, float)) and not isinstance(v, bool) and (abs(v) >= 1e30 or 0 < abs(v) <= 1e-30)
    }
    if extreme:
        values = ", ".join(f"{k}={v!r}" for k, v in extreme.items())
        return f" from finite logits: {values} takes the scores beyond the floating-point range; use a smaller value"
    return ""


def _sound(rows: Tensor) -> bool:
    """Logits (or probabilities) rows as a model gives them: no NaN, no +inf, a finite maximum per row (-inf
    entries are fine: a restricted head's, a union's tokens a member cannot spell)."""
    return not bool(torch.isnan(rows).any()) and bool(torch.isfinite(rows.amax(dim=-1)).all())


def single_model(logits: Sequence[Tensor], sampling: Sampling) -> Tensor:
    """The target of one-model methods (``large_model``, ``small_model``, ``sd``)."""
    (row,) = logits
    return probs(row, sampling)
