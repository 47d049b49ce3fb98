"""The feature head ``vllm_eagle`` and ``vllm_eagle3`` hand vLLM: a checkpoint that vLLM runs as the head runs here.

vLLM's EAGLE for Llama models (``EagleLlamaForCausalLM``, speculator ``eagle``) reads the target's features after
its final norm, puts its predictions straight into the target's output head over the whole vocabulary, and has an
``fc`` without bias. A head of EAGLE's layout trained here (``eagle: {layout: eagle, head_tokens: 0}``) is saved as
such a checkpoint (``models/head_files.save_head``), and a published EAGLE-1 checkpoint is one; a head of this
project's own layout (features before the norm) or over part of the vocabulary would draft other tokens in vLLM
than here, so it is refused in one line, when the config is read where its recipe shows it, else before the job
starts.

vLLM's EAGLE-3 (``Eagle3LlamaForCausalLM``, speculator ``eagle3``) reads the published EAGLE-3 layout as
``models/eagle3.py`` does: the inputs of the three layers its ``eagle_config`` names (vLLM's aux hidden states:
layer ``i``'s input), a ``midlayer``, its own norm and ``lm_head`` over a draft vocabulary mapped by ``d2t``. A head
trained here with ``eagle: {layout: eagle3}`` is saved as such a checkpoint (``models/eagle3_training.save``), a
published one is one; any other head is refused in one line, as above."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..errors import UserError
from ..files import read_tensors, read_user_json, user_file
from ..models.eagle3 import is_eagle3
from ..models.feature_head import EAGLE_WEIGHTS, HEAD_CONFIG, WEIGHTS_LIMIT, HeadRecipe
from ..models.head_files import head_config
from ..models.resolve import recipe_of

TRAIN_FOR_VLLM = "eagle: {layout: eagle, head_tokens: 0}"  # a recipe whose head vLLM's EAGLE runs as ours does
TRAIN_FOR_VLLM_EAGLE3 = "eagle: {layout: eagle3}"  # one whose head vLLM's EAGLE-3 runs as ours does


def entry_problem(speculator: str, model: str, eagle: str | dict[str, Any] | None) -> str | None:
    """Why a config model's ``eagle`` entry gives no head vLLM's ``speculator`` (``eagle`` or ``eagle3``) can run,
    as far as the config shows (None: it may; a directory is checked when the job starts, ``checkpoint``)."""
    train = TRAIN_FOR_VLLM_EAGLE3 if speculator == "eagle3" else TRAIN_FOR_VLLM
    if eagle is None:
        published = "an EAGLE-3" if speculator == "eagle3" else "a published EAGLE-1"
        return f"model {model!r} has no feature head; give it {train} or {published} checkpoint"
    if isinstance(eagle, dict):
        recipe = recipe_of(HeadRecipe, eagle, f"eagle settings for {model!r}")
        if speculator == "eagle3" and recipe.layout != "eagle3":
            return (
                f"vLLM's EAGLE-3 runs EAGLE-3's layout, and model {model!r}'s head recipe {json.dumps(eagle)} is "
                f"not; give it {train}"
            )
        if speculator == "eagle" and not _runs_in_vllm(recipe):
            return (
                f"vLLM runs EAGLE's layout over the whole vocabulary, and model {model!r}'s head recipe "
                f"{json.dumps(eagle)} is not; give it {train}"
            )
    if isinstance(eagle, str):
        eagle3 = _is_eagle3(Path(eagle).expanduser())
        if speculator == "eagle" and eagle3:
            return (
                f"model {model!r}'s head {eagle} is an EAGLE-3 checkpoint; vLLM's EAGLE (EAGLE-1's layout) cannot run "
                "it: vllm_eagle3 does"
            )
        if speculator == "eagle3" and eagle3 is False:
            return f"model {model!r}'s head {eagle} is no EAGLE-3 checkpoint; vLLM's EAGLE-3 runs EAGLE-3's layout"
    return None


def _is_eagle3(head: Path) -> bool | None:
    """Whether the directory ``head`` holds an EAGLE-3 checkpoint (its decoder layer named ``midlayer``); None
    where that cannot be told (no weights, unreadable: the loader says why, in one line, when the job starts)."""
    weights = next((head / f for f in EAGLE_WEIGHTS if (head / f).is_file()), None)
    if weights is None:
        return None
    try:
        return is_eagle3(_names(weights))
    except Exception:  # noqa: BLE001 (unreadable: the loader says why, in one line, when the job starts)
        return None


def _runs_in_vllm(recipe: HeadRecipe) -> bool:
    return recipe.layout == "eagle" and recipe.head_tokens == 0  # EAGLE's layout over the whole vocabulary


def checkpoint(head: Path, speculator: str = "eagle") -> Path:
    """``head`` (a feature head's directory) as the model of vLLM's ``speculator`` (``eagle``: ``vllm_eagle``,
    ``eagle3``: ``vllm_eagle3``, and their ``_pr55006`` forms): itself, when vLLM runs it as ours runs; else one
    line (``UserError``) saying why not."""
    eagle3 = speculator == "eagle3"
    name = f"vllm_{speculator}"
    config_file = head / HEAD_CONFIG
    if config_file.exists():  # one trained here in this project's layout or EAGLE's
        config = head_config(config_file, None)  # a config that is not one: one line
        if eagle3:
            raise UserError(
                f"{name}: the feature head {head} is of the {config['layout']} layout; vLLM's EAGLE-3 runs EAGLE-3's: "
                f"train one with {TRAIN_FOR_VLLM_EAGLE3}"
            )
        if config["layout"] != "eagle":
            why = "reads the target's features before its final norm (this project's layout)"
        elif config.get("kept"):
            why = f"proposes {len(config['kept'])} of the vocabulary's ids"
        elif config.get("bias"):
            why = "has an fc bias"
        else:
            return head
        raise UserError(
            f"{name}: the feature head {head} {why}; vLLM's EAGLE cannot run it: train one with {TRAIN_FOR_VLLM}"
        )
    weights = next((head / f for f in EAGLE_WEIGHTS if (head / f).exists()), None)
    if weights is None or not (head / "config.json").exists():
        raise UserError(f"{name}: {head} is no EAGLE checkpoint (config.json and {' or '.join(EAGLE_WEIGHTS)})")
    config = read_user_json(head / "config.json", f"{name}: the checkpoint's config")
    if not isinstance(config, dict):
        raise UserError(f"{name}: {head / 'config.json'} holds a {type(config).__name__}; a JSON object expected")
    names = _names(weights)
    midlayer = is_eagle3(names)
    if eagle3 and not midlayer:
        raise UserError(
            f"{name}: {head} is an EAGLE-1 checkpoint (no midlayer.*); vLLM's EAGLE-3 runs EAGLE-3's layout: "
            "vllm_eagle runs this one"
        )
    if eagle3:
        return head
    if midlayer:  # EAGLE-3's: vLLM runs it as "eagle3", not "eagle"
        raise UserError(
            f"{name}: {head} is an EAGLE-3 checkpoint; vLLM's EAGLE (EAGLE-1's layout) cannot run it: vllm_eagle3 does"
        )
    if "fc.bias" in names:
        raise UserError(f"{name}: the EAGLE checkpoint {head} has an fc bias, which vLLM's EAGLE for Llama has not")
    return head


def _names(weights: Path) -> set[str]:
    """The tensor names of a head's weight file (a pipe or a device in its place: one line, never a wait)."""
    user_file(weights, "feature head weights", WEIGHTS_LIMIT)
    if weights.suffix == ".safetensors":
        from safetensors import safe_open

        with safe_open(weights, "pt") as f:
            return set(f.keys())
    return set(read_tensors(weights, "feature head weights", WEIGHTS_LIMIT))  # a pickle: one line, refused unread
