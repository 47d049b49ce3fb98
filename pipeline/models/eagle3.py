"""EAGLE-3 heads, loaded as published (Li et al. 2025, "EAGLE-3: Scaling up Inference Acceleration of Large Language
Models via Training-Time Test"; the layout of its release and of vLLM's and SGLang's ``Eagle3LlamaForCausalLM``).

Where EAGLE-1 (``feature_head.py``) drafts from the target's last hidden state, EAGLE-3 fuses three of them: the
inputs of the target's decoder layers ``2``, ``L // 2`` and ``L - 3`` (low, middle, high, for a target of ``L``
layers: the rule of EAGLE-3's code and of vLLM's ``get_eagle3_aux_hidden_state_layers``; a checkpoint may name
its own in ``eagle_config.eagle_aux_hidden_state_layer_ids``), concatenated in layer order and mapped by ``fc``
(``3d -> d``, no bias) to one feature g_t. Its one decoder layer, ``midlayer``, takes the token's embedding and the
feature together: ``input_layernorm`` on the embedding, ``hidden_norm`` on the feature, their concatenation (2d)
into attention whose q/k/v read 2d inputs, the feature itself as the residual; then ``post_attention_layernorm``
and the MLP as a Llama layer's. Its output before the final norm is the next position's feature (the head drafts
on from it, without ``fc``); after the head's own ``norm``, its own ``lm_head`` scores a reduced draft vocabulary,
whose id ``i`` is the target's ``i + d2t[i]`` (``t2d``, the target-side mask, is not needed to draft). Every other
id gets probability exactly 0, and the target's full vocabulary verifies: the acceptance rule keeps every method
exact whatever the head proposes (docs/algorithms.md).

The embedding is the target's (published EAGLE-3 checkpoints hold none, or a copy of it). A checkpoint is
``config.json`` plus ``model.safetensors`` or ``pytorch_model.bin`` with ``fc.weight``, ``midlayer.*``,
``norm.weight``, ``lm_head.weight`` and, for a reduced vocabulary, ``d2t``; it is checked against the target as it
loads (``load_eagle3``), each problem one line.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

from .spec import ModelError

LAYOUT = "eagle3"
MIDLAYER = "midlayer."


def aux_layers(config: dict, layers: int) -> tuple[int, ...]:
    """The target's decoder layers whose inputs the head fuses, in layer order: the checkpoint's own
    (``eagle_config.eagle_aux_hidden_state_layer_ids``) or EAGLE-3's rule, ``(2, L // 2, L - 3)``; one line where
    they are not three distinct layers of a target of ``layers`` layers."""
    eagle_config = config.get("eagle_config") or {}
    if not isinstance(eagle_config, dict):
        raise ModelError(f"EAGLE-3 head: eagle_config={json.dumps(eagle_config)[:40]}; expected a mapping")
    own = eagle_config.get("eagle_aux_hidden_state_layer_ids")
    ids = tuple(own) if own is not None else (2, layers // 2, layers - 3)
    fine = all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i < layers for i in ids)
    if len(ids) != 3 or not fine or len(set(ids)) != 3:
        whose = "its eagle_aux_hidden_state_layer_ids" if own is not None else "EAGLE-3's rule (2, L // 2, L - 3)"
        raise ModelError(
            f"EAGLE-3 head: {whose} gives layers {list(ids)} of a target of {layers} layers; it fuses three distinct "
            "layers' inputs (a target of 7 layers or more, or a checkpoint naming three of its layers)"
        )
    return tuple(sorted(ids))


# The rotary base of a head whose config.json names no rope: EAGLE-3's own code, vLLM's llama_eagle3 and SGLang read
# the draft's config with Llama's default (10,000), whatever the target's (EAGLE-3's training config for
# Llama-3.1-8B names none, its target 500,000): the rows the head was trained on.
DEFAULT_ROPE_THETA = 10000.0


def head_config(config: dict, target: nn.Module):
    """The head's Llama config: the checkpoint's shapes and rope (its own, whole; none named: ``DEFAULT_ROPE_THETA``,
    never the target's), eager attention (an explicit mask over its cache)."""
    from transformers import LlamaConfig

    keys = (
        "hidden_size",
        "intermediate_size",
        "num_attention_heads",
        "num_key_value_heads",
        "head_dim",
        "rms_norm_eps",
        "hidden_act",
        "max_position_embeddings",
        "rope_theta",
        "rope_scaling",
        "rope_parameters",
        "attention_bias",
        "mlp_bias",
    )
    rope = ("rope_theta", "rope_scaling", "rope_parameters")
    ours = {k: v for k, v in target.config.to_dict().items() if k not in rope}  # never the target's rope
    if not any(config.get(k) is not None for k in rope):  # none named: the published readers' default base
        ours["rope_theta"] = DEFAULT_ROPE_THETA
    found = {k: config[k] if config.get(k) is not None else ours.get(k) for k in keys}
    found = {k: v for k, v in found.items() if v is not None}
    no_ids = {"bos_token_id": None, "eos_token_id": None, "pad_token_id": None}  # it scores no vocabulary of its own
    head = LlamaConfig(**found, num_hidden_layers=1, vocab_size=1, **no_ids)
    head._attn_implementation = "eager"
    return head


class Eagle3Layer(nn.Module):
    """``midlayer``: a Llama decoder layer whose attention reads the normed embedding and the normed feature
    side by side (q/k/v of 2d inputs), with the feature as its residual."""

    def __init__(self, config, norm_before_residual: bool = False):
        super().__init__()
        from transformers.models.llama.modeling_llama import LlamaAttention, LlamaMLP, LlamaRMSNorm

        d, eps = config.hidden_size, config.rms_norm_eps
        self.self_attn = LlamaAttention(config, layer_idx=0)
        attn, bias = self.self_attn, bool(getattr(config, "attention_bias", False))
        for name in ("q_proj", "k_proj", "v_proj"):
            old = getattr(attn, name)
            setattr(attn, name, nn.Linear(2 * d, old.out_features, bias=bias))
        self.mlp = LlamaMLP(config)
        self.input_layernorm = LlamaRMSNorm(d, eps=eps)
        self.hidden_norm = LlamaRMSNorm(d, eps=eps)
        self.post_attention_layernorm = LlamaRMSNorm(d, eps=eps)
        self.norm_before_residual = norm_before_residual  # a checkpoint's ``norm_before_residual`` (vLLM's)

    def forward(self, embeds, features, position_embeddings, mask, cache):
        normed = self.hidden_norm(features)
        residual = normed if self.norm_before_residual else features
        x = torch.cat([self.input_layernorm(embeds), normed], dim=-1)
        attended, _ = self.self_attn(x, position_embeddings, mask, cache)
        hidden = residual + attended
        return hidden + self.mlp(self.post_attention_layernorm(hidden))


class Eagle3Head(nn.Module):
    """An EAGLE-3 head for ``target``: ``fc``, ``midlayer``, ``norm``, ``lm_head`` and ``d2t`` its own, the
    embedding the target's. The interface of ``FeatureHead`` (``decoding/proposers/feature.py`` drafts through
    either): ``fuse`` the target's three layers' inputs into a feature, ``step`` features to the next ones in its
    own KV cache (``new_cache``), ``logits`` of a feature over the target's whole vocabulary."""

    layout = LAYOUT

    def __init__(self, target: nn.Module, config: dict, draft_vocab: int):
        super().__init__()
        from transformers.models.llama.modeling_llama import LlamaRMSNorm, LlamaRotaryEmbedding

        self.config = head_config(config, target)
        d = self.config.hidden_size
        layers = int(target.config.num_hidden_layers)
        self.aux_layers = aux_layers(config, layers)
        self.fc = nn.Linear(3 * int(config.get("target_hidden_size", d)), d, bias=False)
        self.midlayer = Eagle3Layer(self.config, bool(config.get("norm_before_residual", False)))
        self.norm = LlamaRMSNorm(d, eps=self.config.rms_norm_eps)
        self.lm_head = nn.Linear(d, draft_vocab, bias=False)
        self.register_buffer("d2t", torch.zeros(draft_vocab, dtype=torch.long))
        self.rotary = LlamaRotaryEmbedding(self.config)
        self.borrowed = (target.get_input_embeddings(),)  # a tuple: not a submodule, not saved
        self.vocab_size = int(target.get_output_embeddings().weight.shape[0])
        self.target_config = json.loads(target.config.to_json_string(use_diff=False))  # its rope, when saved
        self.eval()

    @property
    def kept(self) -> torch.Tensor:
        """The target's ids the draft vocabulary scores, draft id by draft id (``i + d2t[i]``)."""
        return torch.arange(self.d2t.shape[0], device=self.d2t.device) + self.d2t

    def new_cache(self):
        from transformers import DynamicCache

        return DynamicCache()

    def fuse(self, hidden: torch.Tensor) -> torch.Tensor:
        """The target's three layers' inputs ``[..., 3d]`` (``read_features``) as the head's feature ``[..., d]``."""
        return self.fc(hidden.to(device=self.fc.weight.device, dtype=self.fc.weight.dtype))

    def step(self, features: torch.Tensor, tokens: torch.Tensor, cache, start: int) -> torch.Tensor:
        """Inputs ``start, start + 1, ...``: (feature g_t ``[k, d]``, next token x_{t+1} ``[k]``) -> the features
        after them ``[k, d]`` (before the final norm: what it drafts on from), appended to ``cache`` (None: the
        whole sequence, no cache)."""
        embeds = self.embed(tokens)
        features = features.to(device=embeds.device, dtype=embeds.dtype)[None]
        k = embeds.shape[1]
        positions = torch.arange(start, start + k, device=embeds.device)[None]
        past = start if cache is not None else 0
        if cache is not None and cache.get_seq_length() != start:
            raise ValueError(f"EAGLE-3 head: its cache holds {cache.get_seq_length()} inputs, step starts at {start}")
        keys = torch.arange(past + k, device=embeds.device)
        visible = keys[None, :] <= (past + torch.arange(k, device=embeds.device))[:, None]
        return self.attend(embeds, features, positions, visible, cache)

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        """The target's embeddings of ``tokens`` ``[k]`` as ``[1, k, d]``, on the head's device and in its dtype."""
        embedding, weight = self.borrowed[0], self.fc.weight
        return embedding(tokens.to(embedding.weight.device)).to(device=weight.device, dtype=weight.dtype)[None]

    def attend(self, embeds, features, positions, visible, cache) -> torch.Tensor:
        """The midlayer on ``[1, k, d]`` embeddings and features at ``positions`` ``[1, k]``, each input seeing the
        keys ``visible`` ``[k, keys]`` marks (those in ``cache`` first, then its own); appended to ``cache``."""
        mask = torch.zeros(visible.shape, dtype=embeds.dtype, device=embeds.device)
        mask = mask.masked_fill_(~visible, torch.finfo(embeds.dtype).min)[None, None]
        cos_sin = self.rotary(embeds, positions)
        return self.midlayer(embeds, features, cos_sin, mask, cache)[0]

    def kept_logits(self, features: torch.Tensor) -> torch.Tensor:
        """Logits over the draft vocabulary ``[..., K]`` of the token after each feature."""
        return self.lm_head(self.norm(features))

    def logits(self, feature: torch.Tensor) -> torch.Tensor:
        """A full-vocabulary logits row for one feature: -inf outside the draft vocabulary (probability 0)."""
        small = self.kept_logits(feature[None])[0]
        small = small if small.dtype in (torch.float32, torch.float64) else small.float()
        return small.new_full((self.vocab_size,), float("-inf")).index_copy_(0, self.kept, small)


def is_eagle3(raw) -> bool:
    """Whether a checkpoint's tensors (or their names) are EAGLE-3's (its decoder layer named ``midlayer``)."""
    return any(k.startswith(MIDLAYER) for k in raw)


def load_eagle3(path: Path, raw: dict[str, torch.Tensor], config: dict, target: nn.Module) -> Eagle3Head:
    """An EAGLE-3 head for ``target`` from a checkpoint's tensors ``raw`` and its ``config.json`` ``config``,
    checked against the target, each problem one ``ModelError`` line naming the checkpoint."""
    where = f"EAGLE-3 checkpoint {path}"
    d = int(target.config.hidden_size)
    layers = config.get("num_hidden_layers", 1)
    if layers != 1 or any(k.startswith("layers.") for k in raw):
        raise ModelError(f"{where}: num_hidden_layers={json.dumps(layers)[:20]}; the layout read here has one layer")
    if int(config.get("hidden_size", d)) != d or int(config.get("target_hidden_size", d)) != d:
        raise ModelError(
            f"{where}: hidden_size {config.get('hidden_size')} (target_hidden_size "
            f"{config.get('target_hidden_size', config.get('hidden_size'))}); the target's is {d}: it was trained "
            "for another model"
        )
    head_rows = raw.get("lm_head.weight")
    if head_rows is None or head_rows.dim() != 2:
        raise ModelError(f"{where}: no lm_head.weight of [draft vocabulary, {d}]")
    draft_vocab = int(head_rows.shape[0])
    if config.get("draft_vocab_size", draft_vocab) != draft_vocab:
        raise ModelError(
            f"{where}: draft_vocab_size={config['draft_vocab_size']} but lm_head.weight has {draft_vocab} rows"
        )
    head = Eagle3Head(target, config, draft_vocab)
    own = head.state_dict()
    state = {k: v for k, v in raw.items() if k in own}  # embed_tokens (the target's), t2d: not the head's
    if "d2t" not in state:
        state["d2t"] = torch.zeros(draft_vocab, dtype=torch.long)  # the full vocabulary, in order
    missing = sorted(set(own) - set(state))
    if missing:
        raise ModelError(f"{where}: {len(missing)} of its weights missing (first: {missing[0]})")
    for name, tensor in state.items():
        if tuple(tensor.shape) != tuple(own[name].shape):
            raise ModelError(
                f"{where}: {name} of shape {tuple(tensor.shape)}, the target needs {tuple(own[name].shape)} "
                "(a head of another model?)"
            )
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            raise ModelError(f"{where}: {name} holds NaN or infinite weights")
    ids = torch.arange(draft_vocab) + state["d2t"].long()
    if state["d2t"].is_floating_point() or int(ids.min()) < 0 or int(ids.max()) >= head.vocab_size:
        raise ModelError(f"{where}: d2t maps draft ids outside the target's {head.vocab_size} ids")
    if len(set(ids.tolist())) != draft_vocab:
        raise ModelError(f"{where}: d2t maps two draft ids to one target id")
    head.load_state_dict({**state, "d2t": state["d2t"].long()}, strict=False)
    return to_target(head, target)


def to_target(head: nn.Module, target: nn.Module) -> nn.Module:
    """``head`` on ``target``'s output device and in its dtype, its rotary frequencies kept in float32 or finer
    (as the target's own: cast to bfloat16 they would turn the angles of far positions by tenths of a radian)."""
    frequencies = {name: buf.clone() for name, buf in head.named_buffers() if name.endswith("inv_freq")}
    head.to(device=target.get_output_embeddings().weight.device, dtype=target.dtype)
    for name, buf in frequencies.items():
        owner, _, attr = name.rpartition(".")
        module = head.get_submodule(owner) if owner else head
        finer = buf.dtype if target.dtype not in (torch.float32, torch.float64) else target.dtype
        setattr(module, attr, buf.to(device=getattr(module, attr).device, dtype=finer))
    return head
