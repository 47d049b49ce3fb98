"""The feature head ``vllm_eagle`` hands vLLM: an EAGLE checkpoint that vLLM runs as the head runs here.

vLLM's EAGLE for Llama models (``EagleLlamaForCausalLM``) reads the target's features after its final norm, puts
its predictions straight into the target's output head over the whole vocabulary, and has an ``fc`` without
bias. A head of EAGLE's layout trained here (``eagle: {layout: eagle, head_tokens: 0}``) is saved as such a
checkpoint (``models/feature_head.save_head``), and a published EAGLE-1 checkpoint is one; a head of this
project's own layout (features before the norm) or over part of the vocabulary would draft other tokens in
vLLM than here, so it is refused in one line, when the config is read where its recipe shows it, else before the
job starts."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..errors import UserError
from ..models.feature_head import EAGLE_WEIGHTS, HEAD_CONFIG, HeadRecipe, head_config
from ..models.resolve import recipe_of

TRAIN_FOR_VLLM = "eagle: {layout: eagle, head_tokens: 0}"  # a recipe whose head vLLM runs as ours does


def entry_problem(model: str, eagle: str | dict[str, Any] | None) -> str | None:
    """Why a config model's ``eagle`` entry gives no head vLLM can run, as far as the config shows (None: it
    may; a directory is checked when the job starts, ``checkpoint``)."""
    if eagle is None:
        return f"model {model!r} has no feature head; give it {TRAIN_FOR_VLLM} or a published EAGLE checkpoint"
    if isinstance(eagle, dict) and not _runs_in_vllm(recipe_of(HeadRecipe, eagle, f"eagle settings for {model!r}")):
        return (
            f"vLLM runs EAGLE's layout over the whole vocabulary, and model {model!r}'s head recipe "
            f"{json.dumps(eagle)} is not; give it {TRAIN_FOR_VLLM}"
        )
    if isinstance(eagle, str) and _is_eagle3(Path(eagle).expanduser()):
        return f"model {model!r}'s head {eagle} is an EAGLE-3 checkpoint; vLLM's EAGLE (EAGLE-1's layout) cannot run it"
    return None


def _is_eagle3(head: Path) -> bool:
    """Whether the directory ``head`` holds an EAGLE-3 checkpoint (its decoder layer named ``midlayer``)."""
    weights = next((head / f for f in EAGLE_WEIGHTS if (head / f).is_file()), None)
    try:
        return weights is not None and any(name.startswith("midlayer.") for name in _names(weights))
    except Exception:  # noqa: BLE001 (unreadable: the loader says why, in one line, when the job starts)
        return False


def _runs_in_vllm(recipe: HeadRecipe) -> bool:
    return recipe.layout == "eagle" and recipe.head_tokens == 0  # EAGLE's layout over the whole vocabulary


def checkpoint(head: Path) -> Path:
    """``head`` (a feature head's directory) as vLLM's EAGLE model: itself, when vLLM runs it as ours runs; else
    one line (``UserError``) saying why not."""
    config_file = head / HEAD_CONFIG
    if config_file.exists():  # one trained here
        config = head_config(config_file, None)  # a config that is not one: one line
        if config["layout"] != "eagle":
            why = "reads the target's features before its final norm (this project's layout)"
        elif config.get("kept"):
            why = f"proposes {len(config['kept'])} of the vocabulary's ids"
        elif config.get("bias"):
            why = "has an fc bias"
        else:
            return head
        raise UserError(
            f"vllm_eagle: the feature head {head} {why}; vLLM's EAGLE cannot run it: train one with {TRAIN_FOR_VLLM}"
        )
    weights = next((head / f for f in EAGLE_WEIGHTS if (head / f).exists()), None)
    if weights is None or not (head / "config.json").exists():
        raise UserError(f"vllm_eagle: {head} is no EAGLE checkpoint (config.json and {' or '.join(EAGLE_WEIGHTS)})")
    names = _names(weights)
    if any(name.startswith("midlayer.") for name in names):  # EAGLE-3's: vLLM runs it as "eagle3", not "eagle"
        raise UserError(
            f"vllm_eagle: {head} is an EAGLE-3 checkpoint; vLLM's EAGLE (EAGLE-1's layout) cannot run it, and "
            "vLLM's EAGLE-3 beside ours is not a method here yet (our sd with proposer eagle runs it)"
        )
    if "fc.bias" in names:
        raise UserError(f"vllm_eagle: the EAGLE checkpoint {head} has an fc bias, which vLLM's EAGLE for Llama has not")
    return head


def _names(weights: Path) -> set[str]:
    if weights.suffix == ".safetensors":
        from safetensors import safe_open

        with safe_open(weights, "pt") as f:
            return set(f.keys())
    import torch

    return set(torch.load(weights, map_location="cpu", weights_only=True))
