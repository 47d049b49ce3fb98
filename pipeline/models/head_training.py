"""The training of a feature head (``feature_head.FeatureHead``): the teacher's features, EAGLE's loss, the
acceptance it reaches on held-out continuations, and ``distill_head``, which makes a head from a recipe and caches
it (``head_files.save_head``). An EAGLE-3 head is trained by its training-time test (``eagle3_training.py``) from
the same teacher data. docs/proposers.md, "Feature heads".
"""

from __future__ import annotations

import time
from dataclasses import asdict
from pathlib import Path

import torch
from torch import nn

from ..decoding.proposers.feature import read_features
from ..provenance import weights_versions
from . import eagle3_training
from .cpu_kernels import pack_linears
from .feature_head import FeatureHead, HeadRecipe
from .head_files import save_head
from .head_target import distribution, ensemble_target, for_ensemble
from .spec import ModelError
from .teacher import Example, TeacherData, stored_teacher_data
from .training import draft_loss, fit, fixed_threads, loss_at


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
