"""EAGLE-3-style heads trained here (a head recipe's ``layout: eagle3``): the published layout of ``eagle3.py``,
trained on the same teacher data as any head (``head_training.train_head``) by EAGLE-3's training-time test.

The head (``new_head``) fuses the inputs of three of the target's decoder layers (EAGLE-3's rule: ``eagle3.aux_layers``)
through ``fc``; its draft vocabulary is the teacher data's kept ids (``d2t``), its ``lm_head`` starts as the target's
rows of them and its ``norm`` as the target's final norm; ``fc`` and the midlayer start at random. All four are
trained; the embedding is the target's, frozen.

The loss (``ttt_loss``, after Li et al. 2025, "EAGLE-3", section 3): no regression of the next feature (three
layers fused have none to regress to), only the next token's, and not from the target's features alone. Step 0
drafts from the true fused features g_t (with the next token x_{t+1}) the token x_{t+2}; step j drafts from the
head's own step j-1 outputs (with the true next token x_{t+j+1}) the token x_{t+j+2}, at position t+j, seeing
what drafting would have in its cache: the true inputs 0..t (step 0's keys) and its own inputs at t+1..t+j (the
keys of steps 1..j at the same t), nothing else. So the head is trained on the inputs it meets when it drafts a
chain of ``ttt`` tokens. Step j's loss (the recipe's ``loss`` against the teacher's distribution at that row)
weighs 0.8^j (EAGLE-3's weights), normalised to sum to one. The recipe's ``noise`` (EAGLE's augmentation, kept
here beside the test) perturbs the three layers' inputs uniformly, in units of each layer's own scale
(``layer_scales``). ``save`` writes it as an EAGLE-3 checkpoint, which
``head_files.load_head`` reads back through ``eagle3.load_eagle3`` as it reads a published one (over the whole
vocabulary, with no ``d2t``: vLLM takes one only for a reduced vocabulary).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

from .cache import META, write_dir
from .eagle3 import Eagle3Head, to_target
from .teacher import Example
from .training import draft_loss, loss_at

STEP_WEIGHT = 0.8  # step j of the training-time test weighs STEP_WEIGHT ** j (EAGLE-3's)


def new_head(target: nn.Module, kept: list[int]) -> Eagle3Head:
    """An untrained EAGLE-3 head for ``target`` over the draft vocabulary ``kept`` (target ids, in the order of the
    teacher data's columns): the target's shapes, EAGLE-3's three layers, ``lm_head`` and ``norm`` the target's."""
    head = Eagle3Head(target, {}, len(kept))
    ids = torch.tensor(kept, dtype=torch.long)
    with torch.no_grad():
        head.d2t.copy_(ids - torch.arange(len(kept)))
        head.lm_head.weight.copy_(target.get_output_embeddings().weight.detach()[ids].cpu())
        head.norm.weight.copy_(target.model.norm.weight.detach().cpu())
    return to_target(head, target)  # its rotary frequencies kept in float32, as when it is loaded


def layer_scales(features: list[torch.Tensor]) -> torch.Tensor:
    """Each of the three layers' root mean square over ``features`` (``[n, 3d]`` each), spread over its ``d``
    columns ``[3d]``, the first position of every sequence left out: there a model's middle and high layers hold
    values tens of times their usual size (the bundled model's: 157 against 7 and 21), and with it the low
    layer's scale would be the high layers'."""
    rest = torch.cat([f[1:] for f in features])
    d = rest.shape[1] // 3
    return torch.cat([part.pow(2).mean().sqrt().expand(d) for part in rest.split(d, dim=1)])


def ttt_outputs(head: Eagle3Head, ids: torch.Tensor, hidden: torch.Tensor, steps: int):
    """The head's outputs at each step j < ``steps`` of the training-time test on one sequence ``ids`` ``[n]``,
    ``hidden`` ``[n, 3d]`` the target's three layers' inputs there: ``[n - 1, d]`` each, row t the feature drafted
    after anchor t at position t + j (from which the head drafts x_{t+j+2}), computed as a chain drafted from
    anchor t would compute it. Rows whose token x_{t+j+1} is past the end are padding: they see only their own
    keys, and no other row sees them."""
    from transformers import DynamicCache

    n = ids.shape[0]
    m = n - 1
    anchors = torch.arange(m)
    features, cache = head.fuse(hidden[:-1]), DynamicCache()
    for j in range(steps):
        tokens = ids[(anchors + j + 1).clamp_max(n - 1)]  # x_{t+j+1}; past the end: padding
        keys = torch.arange((j + 1) * m)
        step_of, anchor_of = keys // m, keys % m
        # step 0's keys up to the anchor (the true prefix), later steps' keys at the anchor itself (its own drafts)
        visible = ((step_of == 0)[None] & (anchor_of[None] <= anchors[:, None])) | (
            (step_of > 0)[None] & (anchor_of[None] == anchors[:, None])
        )
        features = head.attend(head.embed(tokens), features[None], (anchors + j)[None], visible, cache)
        yield features


def ttt_loss(head: Eagle3Head, example: Example, hidden: torch.Tensor, recipe, step: int = 0) -> torch.Tensor:
    """The training-time test's loss on one sequence (``ttt_outputs`` over ``recipe.ttt`` steps): step j's
    output t against the teacher's distribution at row t + j + 1 (the recipe's ``loss``), weighed by 0.8^j."""
    ids = example.ids[0]
    m = ids.shape[0] - 1
    name = loss_at(recipe.loss, step, recipe.steps)
    weights = [STEP_WEIGHT**j for j in range(recipe.ttt)]
    total = 0.0 * head.fc.weight.sum()  # a sequence with no row to score: a loss of 0 that backward still takes
    for j, (weight, features) in enumerate(zip(weights, ttt_outputs(head, ids, hidden, recipe.ttt))):
        later = example.rows >= 1 + j  # output t predicts x_{t+j+2}: the teacher's row t + j + 1
        if later.any():
            rows = example.rows[later] - 1 - j
            shifted = Example(ids[None, 1 + j :], example.labels[1 + j :], rows, example.logp[later])
            total = total + weight * draft_loss(name, head.kept_logits(features[: m - j]), shifted)
    return total / sum(weights)


def save(head: Eagle3Head, out_dir: Path, meta: dict) -> None:
    """``head`` as an EAGLE-3 checkpoint (``config.json``, ``model.safetensors`` with ``fc``, ``midlayer.*``,
    ``norm``, ``lm_head``, ``d2t`` and ``t2d``, as EAGLE-3's release writes them) beside its ``meta`` record, written
    whole or not at all."""
    from safetensors.torch import save_file

    c = head.config
    vocab = int(head.vocab_size)
    config = {
        "architectures": ["LlamaForCausalLMEagle3"],
        "model_type": "llama",
        "hidden_size": c.hidden_size,
        "target_hidden_size": c.hidden_size,
        "intermediate_size": c.intermediate_size,
        "num_attention_heads": c.num_attention_heads,
        "num_key_value_heads": c.num_key_value_heads,
        "head_dim": getattr(c, "head_dim", c.hidden_size // c.num_attention_heads),
        "num_hidden_layers": 1,
        "rms_norm_eps": c.rms_norm_eps,
        "hidden_act": c.hidden_act,
        "attention_bias": bool(getattr(c, "attention_bias", False)),
        "mlp_bias": bool(getattr(c, "mlp_bias", False)),
        "max_position_embeddings": c.max_position_embeddings,
        "vocab_size": vocab,
        "draft_vocab_size": int(head.d2t.shape[0]),
        "tie_word_embeddings": False,
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": list(head.aux_layers), "use_aux_hidden_state": True},
    }
    for key in ("rope_theta", "rope_scaling", "rope_parameters"):  # the target's rope, as the head was trained
        if head.target_config.get(key) is not None:
            config[key] = head.target_config[key]
    if "rope_theta" not in config and isinstance(config.get("rope_parameters"), dict):
        config["rope_theta"] = config["rope_parameters"].get("rope_theta")
    state = {k: v.detach().contiguous() for k, v in head.state_dict().items() if not k.startswith("rotary.")}
    if state["d2t"].shape[0] < vocab:  # a reduced draft vocabulary: its map to the target's ids, and the mask
        state["t2d"] = torch.zeros(vocab, dtype=torch.bool).index_fill_(0, head.kept.cpu(), True)
    else:  # the whole vocabulary: its rows in the target's order and no map (vLLM takes a d2t only for fewer ids)
        order = torch.argsort(head.kept.cpu())
        state["lm_head.weight"] = state["lm_head.weight"][order].contiguous()
        del state["d2t"]
    files = {"config.json": json.dumps(config, indent=2), META: json.dumps(meta, indent=2)}
    write_dir(out_dir, lambda tmp: save_file(state, tmp / "model.safetensors"), files)
