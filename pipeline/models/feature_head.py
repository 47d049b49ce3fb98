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

This module is the head itself (``FeatureHead``, its recipe, EAGLE's names for its weights); its training is
``head_training.py`` (``train_head``, ``distill_head``), its files ``head_files.py`` (``save_head``, ``load_head``),
as a distilled draft's are split (``distill.py``, ``teacher.py``, ``cache.py``) and EAGLE-3's
(``eagle3.py``, ``eagle3_training.py``).
"""

from __future__ import annotations

import copy
import json
import math
from dataclasses import dataclass

import torch
from torch import nn

from ..decoding.proposers.feature import LAYOUTS
from .head_target import ensemble_target
from .recipe import Recipe
from .spec import ModelError

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
