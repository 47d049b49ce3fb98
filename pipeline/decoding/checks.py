"""The decoder's argument checks: each refuses a bad argument in one line (``ArgumentError``) before any forward."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from ..errors import ArgumentError
from .ensembles import finite
from .loop import DynamicGamma
from .sampling import Sampling
from .spec import MethodSpec, is_int

GAMMA_SCHEDULES = {"fixed": None, "dynamic": DynamicGamma()}  # how a turn's gamma changes between rounds


def head_rows(model: torch.nn.Module) -> int:
    """The rows of a model's output head: its vocabulary, any padding included."""
    return int(model.get_output_embeddings().weight.shape[0])


def check_vocab_size(models: Sequence[torch.nn.Module], vocab_size: int | None) -> int:
    sizes = [head_rows(m) for m in models]
    if vocab_size is not None:
        if not isinstance(vocab_size, int) or vocab_size < 1 or vocab_size > min(sizes):
            raise ArgumentError(
                f"vocab_size={vocab_size!r} must be a positive int no larger than every model's ({sizes})"
            )
        return vocab_size
    if len(set(sizes)) > 1:
        desc = ", ".join(f"model {i}: {s}" for i, s in enumerate(sizes))
        raise ArgumentError(
            f"models have different vocabularies ({desc}); pass generate(tokenizers=[...]), one per model, to "
            "decode over the union of their vocabularies (docs/tokenizers.md); only where the tokenizer is shared "
            "and an embedding matrix is padded, generate(vocab_size=...) joins them"
        )
    return sizes[0]


def check_gamma(spec: MethodSpec, gamma: Any, n_models: int) -> list[int]:
    """Return one gamma per model."""
    method = spec.name
    if is_int(gamma):
        if gamma < 1:
            raise ArgumentError(f"gamma={gamma} for {method!r}: must be an int >= 1")
        return [gamma] * n_models
    if isinstance(gamma, (list, tuple)):
        if not spec.in_turn:
            raise ArgumentError(f"gamma={list(gamma)} for {method!r}: a list is for *_se methods; give one int >= 1")
        if len(gamma) != n_models or not all(is_int(g) and g >= 1 for g in gamma):
            raise ArgumentError(f"gamma={list(gamma)} for {method!r}: expected {n_models} ints >= 1, one per model")
        return list(gamma)
    raise ArgumentError(f"gamma={gamma!r} for {method!r}: expected an int >= 1 or a list of ints")


def check_gamma_schedule(gamma_schedule: Any) -> DynamicGamma | None:
    if not isinstance(gamma_schedule, str) or gamma_schedule not in GAMMA_SCHEDULES:
        raise ArgumentError(f"gamma_schedule={gamma_schedule!r}: expected one of {', '.join(GAMMA_SCHEDULES)}")
    return GAMMA_SCHEDULES[gamma_schedule]


def check_sampling(temperature: Any, top_k: Any, top_p: Any, max_new_tokens: Any) -> Sampling:
    if not finite(temperature) or temperature < 0:
        raise ArgumentError(f"temperature={temperature!r}: expected a finite number >= 0 (0 is greedy)")
    if not is_int(top_k) or top_k < 0:
        raise ArgumentError(f"top_k={top_k!r}: expected an int >= 0 (0 turns it off)")
    if not finite(top_p) or not 0 < top_p <= 1:
        raise ArgumentError(f"top_p={top_p!r}: expected a number in (0, 1] (1 turns it off)")
    if not is_int(max_new_tokens) or max_new_tokens < 0:
        raise ArgumentError(f"max_new_tokens={max_new_tokens!r}: expected an int >= 0")
    return Sampling(float(temperature), top_k, float(top_p))


def check_seed(seed: Any) -> int:
    if not is_int(seed) or not 0 <= seed < 2**64:
        raise ArgumentError(f"seed={seed!r}: expected an int in 0..2**64-1")
    return seed


def prompt_list(prompt_ids: Any, vocab: int) -> list[int]:
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
    if not prompt or not all(is_int(t) for t in prompt):
        raise ArgumentError("prompt_ids must be a non-empty sequence of int token ids")
    bad = next((t for t in prompt if not 0 <= t < vocab), None)
    if bad is not None:
        raise ArgumentError(f"prompt_ids holds {bad}, outside the vocabulary: expected ids in 0..{vocab - 1}")
    return prompt


def eos_set(eos_token_id: Any, vocab: int) -> set[int]:
    if eos_token_id is None:
        return set()
    listed = isinstance(eos_token_id, (list, tuple, set))
    ids = [eos_token_id] if is_int(eos_token_id) else list(eos_token_id) if listed else [None]
    if not ids or not all(is_int(i) and i >= 0 for i in ids):
        raise ArgumentError(f"eos_token_id={eos_token_id!r}: expected an int token id, a list of them, or None")
    if outside := sorted(i for i in ids if i >= vocab):
        raise ArgumentError(
            f"eos_token_id={eos_token_id!r}: {outside[0]} is outside the vocabulary of {vocab} "
            f"(expected ids in 0..{vocab - 1}); generation could never stop on it"
        )
    return set(ids)


def model_name(model: torch.nn.Module, index: int) -> str:
    """How an error names a model: its index and, where known, its name or path."""
    path = getattr(getattr(model, "config", None), "_name_or_path", "") or type(model).__name__
    return f"model {index} ({path})"


def check_loaded(models: Sequence[torch.nn.Module]) -> None:
    """Refuse a model without parameters or with any on the ``meta`` device (its weights never loaded)."""
    for i, model in enumerate(models):
        params = list(model.parameters()) if isinstance(model, torch.nn.Module) else None
        if not params:
            raise ArgumentError(f"{model_name(model, i)} has no parameters: expected a loaded causal LM")
        if any(p.is_meta for p in params):
            raise ArgumentError(
                f"{model_name(model, i)} has weights on the 'meta' device (never loaded); "
                "load it with real weights (from_pretrained without device_map='meta') first"
            )


def check_context(models: Sequence[torch.nn.Module], used: Sequence[int], prompt_len: int, new_tokens: int) -> None:
    """Refuse a prompt plus ``max_new_tokens`` beyond a used model's context (``config.max_position_embeddings``)."""
    need = prompt_len + new_tokens
    for i in used:
        limit = getattr(getattr(models[i], "config", None), "max_position_embeddings", None)
        if is_int(limit) and need > limit:
            raise ArgumentError(
                f"a prompt of {prompt_len} tokens plus max_new_tokens={new_tokens} needs {need} positions; "
                f"{model_name(models[i], i)} holds {limit} (config.max_position_embeddings)"
            )
