"""A feature head's files: ``save_head`` writes a head trained here (this project's layout, or an EAGLE
checkpoint vLLM runs as it is), ``load_head`` reads one of those or a published EAGLE or EAGLE-3 checkpoint and
checks it against its target before a weight is used, ``head_dir_problem`` says what a directory's files show
without the target (when a config naming it is read).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

from ..decoding.proposers.feature import attach
from . import eagle3_training
from .cache import META, write_dir
from .config_json import read_config_json
from .eagle3 import is_eagle3, load_eagle3, to_target
from .feature_head import (
    EAGLE_WEIGHTS,
    HEAD_CONFIG,
    HEAD_LAYOUTS,
    WEIGHTS,
    WEIGHTS_LIMIT,
    FeatureHead,
    from_eagle_state,
)
from .spec import ModelError


def save_head(head: FeatureHead, out_dir: Path, meta: dict) -> None:
    """The head's own weights, its kept ids, layer count and layout, with its facts, written whole or not at all.
    A head of EAGLE's layout is also an EAGLE checkpoint (its weights under EAGLE's names in
    ``model.safetensors``, beside the target's ``config.json`` of its layer count), which vLLM loads as it is;
    one of EAGLE-3's is an EAGLE-3 checkpoint only (``eagle3_training.save``)."""
    from safetensors.torch import save_file

    if head.layout == "eagle3":
        eagle3_training.save(head, out_dir, meta)
        return

    config = {"layers": len(head.decoder.layers), "bias": head.fc.bias is not None, "layout": head.layout}
    config["kept"] = head.kept.tolist() if len(head.kept) < head.vocab_size else None
    files = {HEAD_CONFIG: json.dumps(config), META: json.dumps(meta, indent=2)}
    state, name = (head.own_state(), WEIGHTS) if head.layout == "ours" else (head.eagle_state(), EAGLE_WEIGHTS[0])
    if head.layout == "eagle":
        files["config.json"] = json.dumps({**head.target_config, "num_hidden_layers": len(head.decoder.layers)})
    write_dir(out_dir, lambda tmp: save_file({k: v.contiguous() for k, v in state.items()}, tmp / name), files)


TARGET_KEYS = (
    "hidden_size",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "intermediate_size",
    "rope_theta",
    "rms_norm_eps",
    "hidden_act",
)  # where a head's config must be its target's


CHECKPOINT_CONFIG = "feature head checkpoint config"  # a checkpoint's config.json, as its messages name it


def load_head(path: str | Path, target: nn.Module) -> FeatureHead:
    """A feature head for ``target`` from ``path``: one this project trained (``feature_head.json`` and
    ``feature_head.safetensors``), or a published EAGLE checkpoint (``config.json`` and ``model.safetensors``
    or ``pytorch_model.bin`` holding ``fc.*`` and ``layers.N.*``), or a published EAGLE-3 one (``fc.*``,
    ``midlayer.*``, ``norm.*``, ``lm_head.*``, ``d2t``: ``eagle3.py``). Attached to ``target`` (``attach``).

    Checked as it loads, each problem one ``ModelError`` line naming the file: the head's config (a JSON object,
    a layer count its tensors hold, layers 0 to N, a known layout, kept ids inside the target's
    rows), the checkpoint's ``config.json`` against the target's (``TARGET_KEYS``: a head of another width, rope or
    norm does not fit), every tensor's shape against the head it builds, and every weight finite."""
    path = Path(path)
    if (path / HEAD_CONFIG).exists():
        config = head_config(path / HEAD_CONFIG, target)
        layout = config["layout"]
        weights = path / (WEIGHTS if layout == "ours" else EAGLE_WEIGHTS[0])
        raw = _read(weights)
        eagle_names = raw if layout == "eagle" else {k.removeprefix("decoder."): v for k, v in raw.items()}
        if (found := _layer_count(eagle_names, weights)) != config["layers"]:
            raise ModelError(
                f"feature head {path}: {HEAD_CONFIG} says {config['layers']} layers, its weights hold {found}"
            )
        state = raw if layout == "ours" else from_eagle_state(raw)
    else:
        weights = next((path / f for f in EAGLE_WEIGHTS if (path / f).exists()), None)
        if weights is None or not (path / "config.json").exists():
            raise ModelError(
                f"feature head {path}: neither this project's feature_head.json nor an EAGLE checkpoint "
                f"(config.json and {' or '.join(EAGLE_WEIGHTS)})"
            )
        checkpoint = read_config_json(path / "config.json", CHECKPOINT_CONFIG, complete=False)  # before weights
        raw = _read(weights)
        if is_eagle3(raw):  # EAGLE-3's layout: three layers' features fused, a midlayer, a draft vocabulary
            head = load_eagle3(path, raw, checkpoint, target)
            attach(target, head)
            return head
        if "fc.weight" not in raw or not any(k.startswith("layers.0.") for k in raw):
            raise ModelError(f"EAGLE checkpoint {weights}: no fc.weight or layers.0.* (first keys: {sorted(raw)[:4]})")
        config = {"kept": None, "layers": _layer_count(raw, weights), "bias": "fc.bias" in raw}
        config["layout"], state = "eagle", from_eagle_state(raw)
    if (path / "config.json").exists():
        _check_target_config(path / "config.json", target, config["layers"])
    d = target.config.hidden_size
    if state.get("fc.weight") is None or tuple(state["fc.weight"].shape) != (d, 2 * d):
        shape = None if state.get("fc.weight") is None else tuple(state["fc.weight"].shape)
        raise ModelError(f"feature head {path}: fc.weight of shape {shape}, the target needs ({d}, {2 * d})")
    head = FeatureHead(target, config["kept"], config["layers"], config["bias"], config["layout"])
    own = head.state_dict()
    for name, tensor in state.items():
        if name in own and tuple(tensor.shape) != tuple(own[name].shape):
            raise ModelError(
                f"feature head {path}: {name} of shape {tuple(tensor.shape)}, the target needs "
                f"{tuple(own[name].shape)} (a head of another model?)"
            )
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            raise ModelError(f"feature head {path}: {name} holds NaN or infinite weights")
    missing, unexpected = head.load_state_dict(state, strict=False)
    missing = [k for k in missing if not k.startswith("decoder.embed_tokens")]
    if missing or unexpected:
        raise ModelError(
            f"feature head {path}: {len(missing)} weights missing, {len(unexpected)} not its own "
            f"(first: {(missing + unexpected)[0]})"
        )
    to_target(head, target)
    attach(target, head)
    return head


def head_dir_problem(path: str | Path) -> str | None:
    """Why ``path`` is no feature head's directory, as far as its files show without the target (None: it may be
    one; ``load_head`` checks the rest against the target): checked when a config naming it is read."""
    path = Path(path).expanduser()
    if not path.is_dir():
        return f"{path} is not a directory"
    if (path / HEAD_CONFIG).exists():
        try:
            head_config(path / HEAD_CONFIG, None)
        except ModelError as err:
            return str(err)
        return None
    if not (path / "config.json").exists() or not any((path / f).exists() for f in EAGLE_WEIGHTS):
        return (
            f"{path} holds neither this project's {HEAD_CONFIG} nor an EAGLE checkpoint (config.json and "
            f"{' or '.join(EAGLE_WEIGHTS)})"
        )
    try:
        read_config_json(path / "config.json", CHECKPOINT_CONFIG, complete=False)
    except ModelError as err:
        return str(err)
    return None


def head_config(file: Path, target: nn.Module | None) -> dict:
    """``feature_head.json`` checked: layers (from 1), bias, layout, kept ids (of the target's rows, given one)."""
    config = _json_object(file)
    rows = target.get_output_embeddings().weight.shape[0] if target is not None else float("inf")
    layers, kept = config.get("layers"), config.get("kept")
    if not (isinstance(layers, int) and not isinstance(layers, bool) and layers >= 1):
        raise ModelError(f"feature head {file}: layers={json.dumps(layers)[:40]}; expected a whole number from 1")
    if not isinstance(config.get("bias", True), bool):
        raise ModelError(f"feature head {file}: bias={json.dumps(config['bias'])[:40]}; expected true or false")
    layout = config.get("layout", "ours")  # heads saved before layouts were named are this project's
    if layout not in HEAD_LAYOUTS:
        raise ModelError(f"feature head {file}: layout={json.dumps(layout)[:40]}; accepted: {', '.join(HEAD_LAYOUTS)}")
    ids_ok = isinstance(kept, list) and kept and all(isinstance(i, int) and not isinstance(i, bool) for i in kept)
    if kept is not None and not (ids_ok and min(kept) >= 0 and max(kept) < rows and len(set(kept)) == len(kept)):
        below = f"below the target's {rows} rows" if target is not None else "of 0 or more"
        raise ModelError(f"feature head {file}: kept is not a list of distinct ids {below}")
    return {"layers": layers, "bias": config.get("bias", True), "layout": layout, "kept": kept}


def _layer_count(raw: dict[str, torch.Tensor], file: Path) -> int:
    """The decoder layers ``raw``'s ``layers.N.*`` tensors hold: 0 to N, each present (a name such as
    ``layers.999999.*`` alone never builds a million layers)."""
    found = {k.split(".")[1] for k in raw if k.startswith("layers.")}
    if not all(n.isdigit() and len(n) <= 4 for n in found) or sorted(map(int, found)) != list(range(len(found))):
        shown = sorted(found, key=len)[:4]
        raise ModelError(f"feature head {file}: its layers.N.* tensors are not layers 0 to N (found {shown})")
    return len(found)


def _json_object(file: Path) -> dict:
    from ..errors import UserError
    from ..files import read_user_json

    try:
        value = read_user_json(file, "feature head config")
    except UserError as err:
        raise ModelError(str(err)) from None
    if not isinstance(value, dict):
        raise ModelError(f"feature head config {file}: a JSON object expected, not {type(value).__name__}")
    return value


def _check_target_config(file: Path, target: nn.Module, layers: int) -> None:
    """A checkpoint's ``config.json`` (the model it was trained for, of the head's ``layers``) against ``target``'s,
    where they must agree."""
    theirs, ours = dict(read_config_json(file, CHECKPOINT_CONFIG, complete=False)), target.config.to_dict()
    for config in (theirs, ours):  # rope_theta: at the top (transformers 4, EAGLE's releases) or in rope_parameters
        rope = config.get("rope_parameters")
        if "rope_theta" not in config and isinstance(rope, dict) and "rope_theta" in rope:
            config["rope_theta"] = rope["rope_theta"]
    if theirs.get("num_hidden_layers", layers) != layers:
        raise ModelError(
            f"feature head {file.parent}: its config.json has num_hidden_layers="
            f"{json.dumps(theirs['num_hidden_layers'])[:40]}, its weights {layers} layers"
        )
    for key in TARGET_KEYS:
        if key in theirs and key in ours and theirs[key] != ours[key]:
            raise ModelError(
                f"feature head {file.parent}: its config.json has {key}={json.dumps(theirs[key])[:40]}, the target "
                f"{json.dumps(ours[key])[:40]}: it was trained for another model"
            )


def _read(file: Path) -> dict[str, torch.Tensor]:
    """A weight file's tensors; one that cannot be read (not a regular file, damaged, a pickle torch's safe loader
    refuses): one line."""
    from ..errors import UserError
    from ..files import read_tensors, user_file

    try:
        user_file(file, "feature head weights", WEIGHTS_LIMIT)
    except UserError as err:
        raise ModelError(str(err)) from None
    try:
        if file.suffix == ".safetensors":
            from safetensors.torch import load_file

            state = load_file(file)
        else:
            state = read_tensors(file, "feature head weights", WEIGHTS_LIMIT)  # a pickle: refused unread
    except Exception as err:  # safetensors' and torch's errors: many kinds, each a multi-line story
        first = (str(err).strip().splitlines() or [type(err).__name__])[0][:160]
        raise ModelError(f"feature head weights {file} cannot be read ({type(err).__name__}: {first})") from None
    if not isinstance(state, dict) or not all(
        isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in state.items()
    ):
        raise ModelError(f"feature head weights {file}: not a mapping of names to tensors")
    return state
