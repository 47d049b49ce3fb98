"""Method names, argument checks and the public ``generate`` entry point."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import torch

from ..errors import ArgumentError
from .engine import Decoder, Member, Stopper
from .ensemble import ENSEMBLES, finite, single_model
from .lookup import PromptLookup
from .runner import HFRunner
from .sampling import Sampling
from .stats import GenerationStats, ModelStats

SINGLE_METHODS = ("large_model", "small_model", "sd")
PROPOSERS = ("draft", "lookup", "lookup+draft")


def method_names() -> list[str]:
    """Every accepted method name, registered ensembles included."""
    names = list(SINGLE_METHODS)
    for name in ENSEMBLES:
        names += [name, f"{name}_sd", f"{name}_se"]
    return names


@dataclass
class GenerationResult:
    token_ids: list[int]
    stats: GenerationStats
    text: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Plan:
    """What a method runs: target members, target function, schedule (None: autoregressive).

    A schedule turn ``(None, gamma)`` proposes by prompt lookup alone.
    """

    members: list[int]
    target_fn: Callable
    schedule: list[tuple[int | None, int]] | None
    lookup: bool = False


def _vocab_size(models: Sequence[torch.nn.Module], vocab_size: int | None) -> int:
    sizes = [int(m.get_output_embeddings().weight.shape[0]) for m in models]
    if vocab_size is not None:
        if not isinstance(vocab_size, int) or vocab_size < 1 or vocab_size > min(sizes):
            raise ArgumentError(
                f"vocab_size={vocab_size!r} must be a positive int no larger than every model's ({sizes})"
            )
        return vocab_size
    if len(set(sizes)) > 1:
        desc = ", ".join(f"model {i}: {s}" for i, s in enumerate(sizes))
        raise ArgumentError(
            f"models have different vocabularies ({desc}); an ensemble needs one shared tokenizer "
            "(pass vocab_size=<tokenizer size> if only the embedding matrices are padded)"
        )
    return sizes[0]


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _check_gamma(method: str, gamma: Any, n_models: int) -> list[int]:
    """Return one gamma per model."""
    if _is_int(gamma):
        if gamma < 1:
            raise ArgumentError(f"gamma={gamma} for {method!r}: must be an int >= 1")
        return [gamma] * n_models
    if isinstance(gamma, (list, tuple)):
        if not method.endswith("_se"):
            raise ArgumentError(f"gamma={list(gamma)} for {method!r}: a list is for *_se methods; give one int >= 1")
        if len(gamma) != n_models or not all(_is_int(g) and g >= 1 for g in gamma):
            raise ArgumentError(f"gamma={list(gamma)} for {method!r}: expected {n_models} ints >= 1, one per model")
        return list(gamma)
    raise ArgumentError(f"gamma={gamma!r} for {method!r}: expected an int >= 1 or a list of ints")


def cheapest(models: Sequence[torch.nn.Module]) -> int:
    """Index of the model with the fewest parameters (the later one on a tie)."""
    sizes = [sum(p.numel() for p in m.parameters()) for m in models]
    return max(range(len(models)), key=lambda i: (-sizes[i], i))


def accepted_args(method: str) -> dict[str, Any]:
    """The ``method_args`` a method takes, with their defaults (raises ValueError for an unknown method)."""
    if method not in method_names():
        raise ArgumentError(f"unknown method {method!r}; accepted: {', '.join(method_names())}")
    accepted: dict[str, Any] = {}
    if method not in SINGLE_METHODS:
        accepted.update(ENSEMBLES[method.removesuffix("_sd").removesuffix("_se")].params)
    if method == "sd" or method.endswith(("_sd", "_se")):
        accepted["proposer"] = "draft"
    if method.endswith(("_sd", "_se")):
        accepted["first_proposer"] = None
    return accepted


def plan_method(
    method: str, models: Sequence[torch.nn.Module], gamma: Any, method_args: dict[str, Any]
) -> tuple[Plan, dict[str, Any]]:
    """Check a method and its arguments against the models; return its plan and resolved args."""
    n = len(models)
    args = dict(method_args)
    accepted = accepted_args(method)
    base = method if method in SINGLE_METHODS else method.removesuffix("_sd").removesuffix("_se")
    unknown = sorted(set(args) - set(accepted))
    if unknown:
        keys = ", ".join(sorted(accepted)) or "none"
        raise ArgumentError(f"unknown method_args {unknown} for {method!r}; accepted: {keys}")
    kind = args.pop("proposer", "draft")
    if kind not in PROPOSERS:
        raise ArgumentError(f"proposer={kind!r} for {method!r}: expected one of {', '.join(PROPOSERS)}")
    lookup, model_drafts = "lookup" in kind, "draft" in kind

    if method in ("large_model", "small_model"):
        index = 0 if method == "large_model" else n - 1
        return Plan([index], single_model, None), args
    if method == "sd":
        if model_drafts and n != 2:
            raise ArgumentError(f"'sd' needs 2 models [target, draft], got {n}")
        g = _check_gamma(method, gamma, n)[-1]
        drafter = 1 if model_drafts else None
        return Plan([0], single_model, [(drafter, g), (0, 0)], lookup), {"proposer": kind, "gamma": g}

    ens = ENSEMBLES[base]
    if n < ens.min_models or (ens.max_models is not None and n > ens.max_models):
        want = (
            str(ens.min_models)
            if ens.max_models == ens.min_models
            else (f"{ens.min_models}" + (f" to {ens.max_models}" if ens.max_models else " or more"))
        )
        raise ArgumentError(f"{method!r} needs {want} models, got {n}")
    if ens.full_vocab:
        for i, m in enumerate(models):
            if getattr(m, "restricted_vocab", False):
                raise ArgumentError(
                    f"{method!r} needs full-vocabulary logits, but model {i} has a restricted output head "
                    "(a distilled draft); use a full-head model here"
                )
    first = args.pop("first_proposer", None)
    params = {**ens.params, **args}
    if ens.check is not None:
        params = ens.check(params, n)
    params = {k: v for k, v in params.items() if k in ens.params and k != "lambda"}
    target_fn = partial(ens.fn, **params)
    members = list(range(n))
    if method == base:
        return Plan(members, target_fn, None), params
    if first is None:
        first = cheapest(models)
    if not _is_int(first) or not 0 <= first < n:
        raise ArgumentError(f"first_proposer={first!r} for {method!r}: expected a model index in 0..{n - 1}")
    gammas = _check_gamma(method, gamma, n)
    if not model_drafts:  # lookup alone proposes, every model verifies: *_sd and *_se coincide
        schedule = [(None, gammas[first])] + [(i, 0) for i in members]
    elif method.endswith("_sd"):
        schedule = [(first, gammas[first])] + [(i, 0) for i in members if i != first]
    else:
        order = members[first:] + members[:first]
        schedule = [(i, gammas[i]) for i in order]
    resolved = {**params, "proposer": kind, "first_proposer": first, "gamma": gammas}
    return Plan(members, target_fn, schedule, lookup), resolved


def check_sampling(temperature: Any, top_k: Any, top_p: Any, max_new_tokens: Any) -> Sampling:
    if not finite(temperature) or temperature < 0:
        raise ArgumentError(f"temperature={temperature!r}: expected a finite number >= 0 (0 is greedy)")
    if not _is_int(top_k) or top_k < 0:
        raise ArgumentError(f"top_k={top_k!r}: expected an int >= 0 (0 turns it off)")
    if not finite(top_p) or not 0 < top_p <= 1:
        raise ArgumentError(f"top_p={top_p!r}: expected a number in (0, 1] (1 turns it off)")
    if not _is_int(max_new_tokens) or max_new_tokens < 0:
        raise ArgumentError(f"max_new_tokens={max_new_tokens!r}: expected an int >= 0")
    return Sampling(float(temperature), top_k, float(top_p))


def check_seed(seed: Any) -> int:
    if not _is_int(seed) or not 0 <= seed < 2**64:
        raise ArgumentError(f"seed={seed!r}: expected an int in 0..2**64-1")
    return seed


def _prompt_list(prompt_ids: Any, vocab: int) -> list[int]:
    if isinstance(prompt_ids, torch.Tensor):
        if prompt_ids.dim() == 2 and prompt_ids.shape[0] == 1:
            prompt_ids = prompt_ids[0]
        if prompt_ids.dim() != 1:
            raise ArgumentError(f"prompt_ids of shape {tuple(prompt_ids.shape)}: expected one sequence")
        prompt_ids = prompt_ids.tolist()
    try:
        prompt = list(prompt_ids)
    except TypeError:
        raise ArgumentError(f"prompt_ids={prompt_ids!r}: expected a non-empty sequence of token ids") from None
    if not prompt or not all(_is_int(t) for t in prompt):
        raise ArgumentError("prompt_ids must be a non-empty sequence of int token ids")
    bad = next((t for t in prompt if not 0 <= t < vocab), None)
    if bad is not None:
        raise ArgumentError(f"prompt_ids holds {bad}, outside the vocabulary: expected ids in 0..{vocab - 1}")
    return prompt


def _eos_set(eos_token_id: Any) -> set[int]:
    if eos_token_id is None:
        return set()
    if _is_int(eos_token_id):
        return {eos_token_id}
    ids = list(eos_token_id) if isinstance(eos_token_id, (list, tuple, set)) else [None]
    if not ids or not all(_is_int(i) and i >= 0 for i in ids):
        raise ArgumentError(f"eos_token_id={eos_token_id!r}: expected an int token id, a list of them, or None")
    return set(ids)


def generate(
    models: Sequence[torch.nn.Module],
    prompt_ids: Sequence[int] | torch.Tensor,
    method: str = "large_model",
    gamma: int | Sequence[int] = 1,
    max_new_tokens: int = 128,
    temperature: float = 0.0,
    top_k: int = 0,
    top_p: float = 1.0,
    method_args: dict[str, Any] | None = None,
    seed: int = 0,
    eos_token_id: int | Sequence[int] | None = None,
    *,
    stop_strings: Sequence[str] = (),
    tokenizer: Any = None,
    vocab_size: int | None = None,
) -> GenerationResult:
    """Generate a continuation of ``prompt_ids`` with ``method``.

    ``models`` are loaded causal LMs in the order the method names them:
    ``[target, draft]`` for ``sd``; ``[expert, amateur]`` for ``cd*``; the
    weight order for ``we*``. ``large_model`` runs ``models[0]``,
    ``small_model`` runs ``models[-1]``. ``gamma`` is an int, or for ``*_se``
    a list with one entry per model; ``method_args`` holds the ensemble's
    parameters (``lambda`` or ``weights``; ``alpha``, ``beta``) and, for
    ``*_sd``/``*_se``, ``first_proposer`` (the index of the model that
    proposes first; default the one with the fewest parameters). Speculative
    methods take ``proposer``: ``draft`` (models propose), ``lookup``
    (prompt lookup alone) or ``lookup+draft`` (lookup where the context
    matches, the model elsewhere). Stop strings need a ``tokenizer``.
    Raises ``ValueError`` on any bad argument before decoding.
    """
    if not isinstance(models, (list, tuple)) or not models:
        raise ArgumentError("models must be a non-empty list of causal LMs")
    vocab = _vocab_size(models, vocab_size)
    if method_args is not None and not isinstance(method_args, dict):
        raise ArgumentError(f"method_args={method_args!r}: expected a dict of argument names to values")
    plan, resolved = plan_method(method, models, gamma, dict(method_args or {}))
    sampling = check_sampling(temperature, top_k, top_p, max_new_tokens)
    prompt = _prompt_list(prompt_ids, vocab)
    eos = _eos_set(eos_token_id)
    if stop_strings and tokenizer is None:
        raise ArgumentError("stop_strings need a tokenizer to decode the output")
    check_seed(seed)

    used = sorted(set(plan.members) | {i for i, _ in plan.schedule or [] if i is not None})
    device = next(models[used[0]].parameters()).device
    stats = GenerationStats(method=method, prompt_tokens=len(prompt))
    stats.models = [ModelStats() for _ in models]
    members = [Member(HFRunner(m, vocab, stats.models[i])) for i, m in enumerate(models)]
    generator = None
    if not sampling.greedy:
        generator = torch.Generator(device=device)
        generator.manual_seed(seed)
    decode = (lambda ids: tokenizer.decode(ids)) if tokenizer is not None else None
    lookup = None
    if plan.lookup:
        lookup = PromptLookup()
        stats.proposers["lookup"] = lookup.stats
    decoder = Decoder(
        members=members,
        targets=plan.members,
        target_fn=plan.target_fn,
        sampling=sampling,
        stopper=Stopper(max_new_tokens, eos, stop_strings, decode),
        generator=generator,
        stats=stats,
        device=device,
        lookup=lookup,
    )
    events = None
    if device.type == "cuda":  # device time too: CUDA events around the whole decode
        torch.cuda.synchronize(device)
        events = [torch.cuda.Event(enable_timing=True) for _ in range(2)]
        events[0].record()
    start = time.perf_counter()
    with torch.inference_mode():
        tokens = decoder.run(prompt, plan.schedule)
    if events is not None:
        events[1].record()
        torch.cuda.synchronize(device)  # the clock is read only once the device is done
        stats.device_time_s = events[0].elapsed_time(events[1]) / 1000
    stats.wall_time_s = time.perf_counter() - start
    stats.new_tokens = len(tokens)
    text = tokenizer.decode(tokens, skip_special_tokens=True) if tokenizer is not None else None
    return GenerationResult(tokens, stats, text, {"method_args": resolved})
