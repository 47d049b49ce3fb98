"""A feature-level draft head (the EAGLE family): it drafts from the target model's own last hidden states.

EAGLE (Li et al. 2024, "EAGLE: Speculative Sampling Requires Rethinking Feature Uncertainty") drafts at the
level of features: at position t the head takes the target's last hidden state (here before its final norm), f_t, and
the embedding of the next token x_{t+1}, fuses them (``fc``: 2d -> d), runs them through one decoder layer of
the target's own kind, and so predicts f_{t+1}; the target's final norm and output head (here restricted to the
kept ids, as a distilled draft's) turn that into the distribution of x_{t+2}. Drafting goes on from predicted
features; the verification forward of the target computes the true ones for free (``decoding/proposers/feature.py``
reads them). Embeddings, final norm and head are the target's, shared and frozen: the head's own weights are
``fc`` and its decoder layer.

Trained here (``distill_head``) on the same teacher data as a draft (``distill.teacher_data``: the teacher's own
continuations of standard-library prompts and teacher-forced standard-library source), by EAGLE's loss: a
smooth-L1 regression of the next feature plus ``cls_weight`` times the forward KL of the next token's
distribution (the teacher's whole distribution over the kept ids), with uniform noise on the input features
(EAGLE's augmentation), for a fixed number of steps from a seed. A published EAGLE checkpoint (``config.json``
plus ``pytorch_model.bin`` or ``model.safetensors`` with ``fc.*`` and ``layers.0.*``; the embedding and head
taken from the target) loads as a head of EAGLE's layout (``load_head``): features after the final norm
(``FeatureHead``). A head trained here in that layout (``layout: eagle``) is saved as such a checkpoint too, which
vLLM runs (``vllm_eagle``, docs/vllm.md). An EAGLE-3 checkpoint loads as an ``eagle3.Eagle3Head`` (three of the
target's layers fused, its own decoder layer, norm and draft vocabulary). docs/proposers.md.
"""

from __future__ import annotations

import copy
import json
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import nn

from ..decoding.proposers.feature import LAYOUTS, attach, read_features
from ..provenance import weights_versions
from . import eagle3_training
from .cache import META, write_dir
from .config_json import read_config_json
from .cpu_kernels import pack_linears
from .eagle3 import is_eagle3, load_eagle3, to_target
from .head_target import distribution, ensemble_target, for_ensemble
from .recipe import Recipe
from .spec import ModelError
from .teacher import Example, TeacherData, stored_teacher_data
from .training import draft_loss, fit, fixed_threads, loss_at

WEIGHTS = "feature_head.safetensors"
HEAD_CONFIG = "feature_head.json"
EAGLE_WEIGHTS = ("model.safetensors", "pytorch_model.bin")  # a published EAGLE checkpoint's weight files
WEIGHTS_LIMIT = 2**36  # bytes: a head's weights larger than this are refused, never read


HEAD_LAYOUTS = tuple(k for k in LAYOUTS if k != "eagle3")  # what FeatureHead builds (EAGLE-3's heads: eagle3.py)


def check_layout(layout: str, accepted: tuple[str, ...] = HEAD_LAYOUTS) -> None:
    """One line (``ModelError``) naming a layout that is none of ``accepted``."""
    if layout not in accepted:
        raise ModelError(f"feature head layout={layout!r}: accepted: {', '.join(accepted)}")


MAX_HEAD_LAYERS = 8  # a feature head is a layer or a few beside its target, never a model of its own size


@dataclass
class HeadRecipe(Recipe):
    layers: int = 1  # the head's decoder layers
    source_chunks: int = 96  # teacher-forced standard-library source: a head learns from more than a draft needs
    steps: int = 1600
    lr: float = 1e-3
    loss: str = "kl"  # the next token's part of the loss: its weight is cls_weight
    cls_weight: float = 0.1
    noise: float = 0.1  # half-width of the uniform noise on the input features while training, in their RMS
    layout: str = "ours"  # "eagle": EAGLE's layout, which vLLM loads; "eagle3": EAGLE-3's (docs/proposers.md)
    ttt: int = 3  # EAGLE-3's training-time test: the steps an eagle3 head drafts on from its own outputs in training
    target: str | dict = "model"  # what it learns to draft: its model's next token, or an ensemble's (head_target.py)

    def __post_init__(self):
        super().__post_init__()
        check_layout(self.layout, tuple(LAYOUTS))
        ensemble_target(self.target)
        if not isinstance(self.ttt, int) or isinstance(self.ttt, bool) or not 1 <= self.ttt <= 16:
            raise ModelError(f"feature head ttt={self.ttt!r}: expected a whole number from 1 to 16")
        if self.layout != "eagle3" and self.ttt != 3:
            raise ModelError(f"feature head ttt={self.ttt}: the training-time test is EAGLE-3's (layout: eagle3)")
        if self.layers > MAX_HEAD_LAYERS:  # each a decoder layer of the target's width, allocated as it is built
            raise ModelError(
                f"feature head layers={self.layers}: expected 1 to {MAX_HEAD_LAYERS} (EAGLE's heads have one)"
            )
        if self.layout == "eagle3" and self.layers != 1:
            raise ModelError(f"feature head layers={self.layers}: an eagle3 head has one layer, its midlayer")
        if self.layout == "eagle3" and self.cls_weight != 0.1:
            raise ModelError(
                f"feature head cls_weight={self.cls_weight}: an eagle3 head's loss is the next token's alone "
                "(EAGLE-3 regresses no feature)"
            )
        for key in ("cls_weight", "noise"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
                raise ModelError(f"feature head {key}={value!r}: expected a finite number of 0 or more")


class FeatureHead(nn.Module):
    """``fc`` and a decoder of ``layers`` layers of the target's kind; the target's embedding, final norm and
    (kept rows of its) output head are borrowed, not owned. The decoder's KV cache is the caller's
    (``new_cache``), so one head serves any number of generations.

    ``layout`` (``decoding.proposers.feature.LAYOUTS``): ``ours`` reads the target's features before its final norm and
    puts its predictions through that norm before the output head; ``eagle`` is EAGLE-1's as published and as
    vLLM runs it (``EagleLlamaForCausalLM``): features after the final norm, predictions straight into the output
    head, and no input norm in the first decoder layer (the fused features enter its attention as they are)."""

    def __init__(
        self, target: nn.Module, kept: list[int] | None, layers: int = 1, bias: bool = True, layout: str = "ours"
    ):
        super().__init__()
        from transformers import AutoModel

        if not isinstance(getattr(getattr(target, "model", None), "norm", None), nn.Module):
            raise ModelError(
                f"a feature head needs a target with a final norm at .model.norm ({type(target).__name__})"
            )
        config = copy.deepcopy(target.config)
        config.num_hidden_layers = layers
        if getattr(config, "layer_types", None):
            config.layer_types = config.layer_types[:layers]
        config.vocab_size, config.pad_token_id = 1, None  # its tokens come in as embeddings, fused with features
        d = config.hidden_size
        self.fc = nn.Linear(2 * d, d, bias=bias, dtype=target.dtype)
        self.decoder = AutoModel.from_config(config, dtype=target.dtype)
        self.decoder.norm = nn.Identity()  # it predicts the feature as it reads them: the target's norm is not its own
        check_layout(layout)
        self.layout = layout
        if layout == "eagle":
            self.decoder.layers[0].input_layernorm = nn.Identity()
        out_norm = target.model.norm if layout == "ours" else nn.Identity()
        self.borrowed = (target.get_input_embeddings(), out_norm)  # a tuple: not submodules, not saved
        # the target's config: an EAGLE checkpoint's config.json, of the head's layer count (save_head)
        self.target_config = json.loads(target.config.to_json_string(use_diff=False))
        full = target.get_output_embeddings().weight
        self.vocab_size = int(full.shape[0])
        ids = torch.tensor(sorted(kept) if kept else range(self.vocab_size), dtype=torch.long)
        self.register_buffer("kept", ids, persistent=False)
        self.register_buffer("head_rows", full.detach()[ids].clone(), persistent=False)  # [K, d]: never trained
        self.eval()

    def new_cache(self):
        from transformers import DynamicCache

        return DynamicCache()

    def step(self, features: torch.Tensor, tokens: torch.Tensor, cache, start: int) -> torch.Tensor:
        """Inputs ``start, start + 1, ...``: (feature f_t ``[k, d]``, next token x_{t+1} ``[k]``) -> the
        predicted features f_{t+1} ``[k, d]``, appended to ``cache`` (None: no cache, the whole sequence)."""
        embed = self.borrowed[0](tokens.to(self.head_rows.device))
        x = self.fc(torch.cat([embed, features.to(embed.dtype)], -1))[None]
        positions = torch.arange(start, start + x.shape[1], device=x.device)[None]
        out = self.decoder(inputs_embeds=x, position_ids=positions, past_key_values=cache, use_cache=cache is not None)
        return out.last_hidden_state[0]

    def fuse(self, features: torch.Tensor) -> torch.Tensor:
        """The target's features as the head drafts from them: as read (EAGLE-3's heads fuse three layers')."""
        return features

    def kept_logits(self, features: torch.Tensor) -> torch.Tensor:
        """Logits over the kept ids ``[..., K]`` of the token after each predicted feature."""
        return self.borrowed[1].forward(features) @ self.head_rows.T  # forward: not the target's norm hooks (ours)

    def logits(self, feature: torch.Tensor) -> torch.Tensor:
        """A full-vocabulary logits row for one predicted feature: -inf outside the kept ids (probability 0)."""
        small = self.kept_logits(feature[None])[0]
        small = small if small.dtype in (torch.float32, torch.float64) else small.float()  # as the decoder's rows
        return small.new_full((self.vocab_size,), float("-inf")).index_copy_(0, self.kept, small)

    def own_state(self) -> dict[str, torch.Tensor]:
        return {k: v for k, v in self.state_dict().items() if not k.startswith("decoder.embed_tokens")}

    def eagle_state(self) -> dict[str, torch.Tensor]:
        """Its own weights under EAGLE's published names (``fc.*``, ``layers.N.*``)."""
        return {k.removeprefix("decoder."): v for k, v in self.own_state().items()}


def from_eagle_state(raw: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A head's state from weights under EAGLE's names (``eagle_state``; other weights, such as a published
    checkpoint's own copy of the embedding, are the target's and left out)."""
    return {
        k if k.startswith("fc.") else f"decoder.{k}": v for k, v in raw.items() if k.split(".")[0] in ("fc", "layers")
    }


@torch.no_grad()  # not inference mode: the features are a training target, saved for backward
def target_features(teacher, sequences: list[torch.Tensor], head="ours") -> list[torch.Tensor]:
    """The teacher's features at every position of each ``[1, n]`` sequence, as ``head`` (or a head of that
    layout) reads them: its last hidden state before its final norm, or after it, or three layers' inputs."""
    found: list[torch.Tensor] = []
    hook = read_features(teacher, head, lambda hidden: found.append(hidden[0].float().clone()))
    try:
        for ids in sequences:
            teacher.model(input_ids=ids, use_cache=False)
    finally:
        hook.remove()
    return found


def head_loss(
    head: FeatureHead,
    example: Example,
    features: torch.Tensor,
    recipe: HeadRecipe,
    noise,
    scale: float,
    step: int = 0,
) -> torch.Tensor:
    """EAGLE's loss on one sequence: inputs (f_t, x_{t+1}) for t < n - 1, targets f_{t+1} (smooth L1, in units of
    ``scale``, the features' root mean square: a model's last hidden states may be large) plus ``cls_weight`` times
    the next token's loss at each labelled row after the first: the recipe's ``loss`` (``distill.LOSSES``, at
    ``step`` for a schedule such as ``kl_tvd``) of the head's distribution over the kept ids against the teacher's,
    as a draft's. The input noise's half-width is ``recipe.noise`` times ``scale``."""
    ids = example.ids[0]
    inputs = features[:-1]
    if recipe.noise:
        inputs = inputs + (torch.rand(inputs.shape, generator=noise) * 2 - 1) * (recipe.noise * scale)
    predicted = head.step(inputs, ids[1:], None, 0)
    loss = nn.functional.smooth_l1_loss(predicted / scale, features[1:] / scale)
    later = example.rows >= 1
    if later.any() and recipe.cls_weight:  # predicted[t] is row t + 1's: the example seen one position on
        shifted = Example(ids[None, 1:], example.labels[1:], example.rows[later] - 1, example.logp[later])
        name = loss_at(recipe.loss, step, recipe.steps)
        loss = loss + recipe.cls_weight * draft_loss(name, head.kept_logits(predicted), shifted)
    return loss


@torch.inference_mode()
def head_acceptance(head: FeatureHead, teacher, held) -> dict:
    """The head's first proposal after each held-out position, from the teacher's true features (teacher
    forcing): greedy agreement with the argmax of ``held``'s distribution there (the teacher's own continuation, or
    an ensemble's choice: ``head_target.for_ensemble``) and expected acceptance at T=1 against it."""
    agree = soft = total = 0.0
    for prompt, cont, logp in held:
        seq = torch.tensor([prompt + cont])
        features = head.fuse(target_features(teacher, [seq], head)[0])
        predicted = head.step(features[:-1], seq[0, 1:], None, 0)  # output t: the token at t + 2
        first = len(prompt) - 2  # the output that predicts cont[0]
        if first < 0:
            continue
        rows = torch.stack([head.logits(f) for f in predicted[first : first + len(cont)]])
        n = rows.shape[0]
        agree += (rows.argmax(-1) == logp[:n].argmax(-1)).sum().item()
        soft += torch.minimum(logp[:n].float().exp(), rows.softmax(-1)).sum().item()
        total += n
    total = max(total, 1)
    return {"agreement": round(agree / total, 4), "acceptance_t1": round(soft / total, 4), "eval_tokens": int(total)}


@torch.inference_mode()
def chain_drafts(head, teacher, prompt: list[int], cont: list[int], best: list[int], gamma: int) -> list[list[int]]:
    """For each position j of ``cont`` (after ``prompt``), the greedy chain of up to ``gamma`` drafts from the
    teacher's true features there, each from the head's own feature after the one before with the judge's token
    ``best[j + d]`` as its input (the token a verification would have kept), up to and including the first draft
    that is not the judge's: ``[]`` where the head has no feature to draft from. A chain also stops after a kept
    draft where the judge's token leaves ``cont`` (an ensemble's choice that is not the model's): the judge's rows
    after it were computed on ``cont``, not on the tokens the chain kept, so they cannot judge it."""
    seq = torch.tensor(prompt + cont)
    features = head.fuse(target_features(teacher, [seq[None]], head)[0])
    chains = []
    for j in range(len(cont)):
        p = len(prompt) + j - 2  # the head's input that drafts cont[j]: (f_p, x_{p+1})
        chain: list[int] = []
        chains.append(chain)
        if p < 0:
            continue
        cache = head.new_cache()
        feature = head.step(features[: p + 1], seq[1 : p + 2], cache, 0)[-1]
        for d in range(min(gamma, len(cont) - j)):
            chain.append(int(head.logits(feature).argmax()))
            if chain[-1] != best[j + d] or best[j + d] != cont[j + d]:
                break
            if d + 1 < gamma:
                feature = head.step(feature[None], torch.tensor([best[j + d]]), cache, p + d + 1)[0]
    return chains


def chain_acceptance(head, teacher, held, gamma: int = 3) -> dict:
    """Greedy chains of up to ``gamma`` drafts from every held-out position (``chain_drafts``, the judge the
    argmax of ``held``'s distribution). ``tau``: 1 + the mean number accepted (tokens per target forward of greedy
    ``sd`` with ``gamma``, every position an anchor); ``depth_acceptance``: at each depth, the share accepted of
    the chains that reached it (where a head drafting from its own features falls off)."""
    reached, kept = [0] * gamma, [0] * gamma
    for prompt, cont, logp in held:
        best = logp.argmax(-1).tolist()
        for j, chain in enumerate(chain_drafts(head, teacher, prompt, cont, best, gamma)):
            for d, token in enumerate(chain):
                reached[d] += 1
                kept[d] += token == best[j + d]
    anchors = max(reached[0], 1)
    return {
        "tau": round(1 + sum(kept) / anchors, 4),
        "depth_acceptance": [round(k / max(r, 1), 4) for k, r in zip(kept, reached)],
        "gamma": gamma,
    }


def train_head(teacher, data: TeacherData, recipe: HeadRecipe, curve: bool = False) -> tuple[FeatureHead, dict]:
    """A head for ``teacher`` trained on ``data`` by ``recipe``: the head and its facts."""
    teacher.requires_grad_(False)  # its embedding and norm are borrowed by the head: they stay frozen
    torch.manual_seed(recipe.seed)
    kept = data.kept if len(data.kept) < teacher.config.vocab_size else None
    if recipe.layout == "eagle3":  # EAGLE-3's layout, over the data's kept ids in the order of its columns
        head = eagle3_training.new_head(teacher, list(data.kept))
    else:  # EAGLE's layout as vLLM loads it: an fc without bias (vLLM's EagleLlamaForCausalLM has none)
        head = FeatureHead(teacher, kept, recipe.layers, bias=recipe.layout == "ours", layout=recipe.layout)
    features = target_features(teacher, [e.ids for e in data.examples], head)
    scale = float(torch.cat(features).pow(2).mean().sqrt())
    by_id = {id(e): f for e, f in zip(data.examples, features)}
    noise = torch.Generator().manual_seed(recipe.seed)
    params = [p for p in head.parameters() if p.requires_grad]
    probe = (lambda step: head_acceptance(head, teacher, data.held)) if curve else None
    if recipe.layout == "eagle3":  # noise in units of each layer's own scale: a deeper layer's features are larger
        widths = recipe.noise * eagle3_training.layer_scales(features)

        def loss(e, step):
            hidden = by_id[id(e)]
            if recipe.noise:
                hidden = hidden + (torch.rand(hidden.shape, generator=noise) * 2 - 1) * widths
            return eagle3_training.ttt_loss(head, e, hidden, recipe, step)
    else:

        def loss(e, step):
            return head_loss(head, e, by_id[id(e)], recipe, noise, scale, step)

    facts = fit(head, params, data.examples, recipe, loss, "train head", probe)
    facts.update(head_acceptance(head, teacher, data.held))
    facts.update(
        feature_scale=round(scale, 4), label_coverage=round(data.label_coverage, 4), train_sequences=len(data.examples)
    )
    facts.update(teacher_seconds=data.seconds, versions=weights_versions())
    return head, facts


def distill_head(
    teacher,
    tokenizer,
    out_dir: Path,
    recipe: HeadRecipe,
    teacher_name: str = "teacher",
    members: tuple = (),
    data_store: Path | None = None,
) -> Path:
    """Train, measure and save a feature head for ``teacher``; returns its directory. ``members``: the other
    members of the ensemble the recipe's ``target`` names, loaded, in its order (``head_target.py``);
    ``data_store``: the file that keeps the teacher's data for every head and draft of the same data
    (``teacher.stored_teacher_data``; None: made here, not kept)."""
    target = ensemble_target(recipe.target)
    wanted = len(target.members) if target is not None else 0
    if len(members) != wanted:
        raise ModelError(
            f"the feature head of {teacher_name!r} is trained with {wanted} other members, got {len(members)}"
        )
    with fixed_threads():
        t0 = time.perf_counter()
        if teacher.dtype == torch.float32 and teacher.device.type == "cpu":
            pack_linears(teacher)  # the teacher only runs inference here: generation and features 2x faster
        data = stored_teacher_data(teacher, tokenizer, recipe, data_store)
        if target is not None:  # the same data, each row's distribution the ensemble's
            data = for_ensemble(data, [teacher, *members], distribution(target, [teacher, *members]))
        head, facts = train_head(teacher, data, recipe)
        facts["target"] = "model" if target is None else target.label()
        facts["total_seconds"] = round(time.perf_counter() - t0, 1)
    save_head(head, out_dir, {"teacher": teacher_name, "kind": "feature_head", "recipe": asdict(recipe), **facts})
    return out_dir


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
