"""The training loop drafts, students and feature heads share (``fit``): seeded, bounded by steps, never by time,
on a fixed number of threads (``fixed_threads``), by one of ``LOSSES``; and how well a trained draft agrees with
its teacher on held-out continuations (``acceptance``).
"""

from __future__ import annotations

import math
import random
import time
from contextlib import contextmanager

import torch

from ..decoding.proposers.lookup import PromptLookup
from .recipe import Recipe
from .spec import ModelError
from .teacher import Example


def loss_at(name: str, step: int, steps: int) -> str:
    """The loss ``name`` trains with at ``step`` of ``steps``: ``kl_tvd`` is ``kl`` for the first half, ``tvd``
    after; every other loss is itself throughout."""
    if name == "kl_tvd":
        return "kl" if step < steps // 2 else "tvd"
    return name


def lr_at(step: int, recipe: Recipe, total: int) -> float:
    if step < recipe.warmup:
        return recipe.lr * (step + 1) / recipe.warmup
    progress = (step - recipe.warmup) / max(total - recipe.warmup, 1)
    return recipe.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0))))


def draft_loss(name: str, logits: torch.Tensor, example: Example) -> torch.Tensor:
    """The loss ``name`` (``LOSSES``) of a draft's logits over the kept ids (``[n, K]``) on ``example``.

    The head scores the kept ids only, so the draft's q is zero elsewhere, and the teacher's mass outside the
    head (``1 - sum p``) is a loss no draft of this head can recover: ``kl`` is sum over kept of p (log p - log q)
    (minimised by q = p renormalised on the head), ``tvd`` is 1 - sum over kept of min(p, q), exactly the chance
    that speculative sampling at T=1 rejects the draft's token."""
    if name == "ce":
        return torch.nn.functional.cross_entropy(logits, example.labels, ignore_index=-100)
    p = example.logp.exp()
    if name == "kl":
        return (p * (example.logp - logits[example.rows].log_softmax(-1))).sum(-1).mean()
    return 1 - torch.minimum(p, logits[example.rows].softmax(-1)).sum(-1).mean()


def fit(model, params: list, examples: list, recipe, loss, desc: str, probe=None) -> dict:
    """Train ``params`` of ``model`` (the rest frozen): AdamW at ``lr_at``'s rate for exactly ``recipe.steps``
    steps, each on one of ``examples`` drawn by a generator seeded with ``recipe.seed``, minimising
    ``loss(example, step)``; returns training facts. Never bounded by time: the same recipe makes the same weights
    however busy the machine. ``probe(step)``, if given, is called every 50 steps and at the end (a learning
    curve); its results are returned under ``curve``. Shared by drafts and students (``student.py``)."""
    from tqdm import tqdm

    if not examples:
        raise ModelError("distillation found no training example (no labelled token the head can score)")
    for p in params:
        p.requires_grad_(True)
    torch.manual_seed(recipe.seed)
    opt = torch.optim.AdamW(params, lr=recipe.lr, betas=(0.9, 0.98), weight_decay=0.0)
    rng = random.Random(recipe.seed)
    start, losses, curve = time.perf_counter(), [], []
    model.train()
    bar = tqdm(range(recipe.steps), desc=desc, unit="step")
    for step in bar:
        if probe is not None and step and step % 50 == 0:
            curve.append({"step": step, **probe(step)})
        example = examples[rng.randrange(len(examples))]
        for group in opt.param_groups:
            group["lr"] = lr_at(step, recipe, recipe.steps)
        value = loss(example, step)
        if not bool(torch.isfinite(value)):  # it cannot train: stop now, before anything is saved or cached
            raise ModelError(
                f"{desc}: the loss is {value.item()} at step {step} of {recipe.steps}; nothing was saved (a recipe "
                "whose loss is not finite cannot train: check its lr and its teacher's outputs)"
            )
        opt.zero_grad(set_to_none=True)
        value.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        losses.append(value.item())
        if step % 20 == 0:
            bar.set_postfix(loss=f"{sum(losses[-20:]) / len(losses[-20:]):.3f}")
    model.eval()
    for p in params:
        p.requires_grad_(False)
    facts = {
        "steps": recipe.steps,
        "train_seconds": round(time.perf_counter() - start, 1),
        "final_loss": round(sum(losses[-50:]) / max(len(losses[-50:]), 1), 4),
        "threads": torch.get_num_threads(),
    }
    if probe is not None:
        facts["curve"] = [*curve, {"step": recipe.steps, **probe(recipe.steps)}]
    return facts


@torch.inference_mode()
def acceptance(draft, held: list[tuple[list[int], list[int], torch.Tensor]]) -> dict:
    """How the draft's proposals fare on the teacher's held-out greedy continuations (teacher forcing):
    ``agreement``, the greedy acceptance (its argmax is the teacher's), alone and with prompt lookup first;
    ``acceptance_t1``, the expected acceptance at T=1 (sum over the vocabulary of min(p, q): the chance that
    speculative sampling keeps a token the draft sampled), alone and with lookup first (a lookup token t is
    kept with probability p(t))."""
    lookup = PromptLookup()
    device = next(draft.parameters()).device
    alone = with_lookup = soft = soft_lookup = total = 0.0
    for prompt, cont, logp in held:
        seq = prompt + cont
        logits = draft(torch.tensor([seq], device=device)).logits[0].float().cpu()
        guesses = logits.argmax(-1).tolist()
        q = logits[len(prompt) - 1 : len(seq) - 1].softmax(-1)
        p = logp.float().exp()
        kept = torch.minimum(p, q).sum(-1).tolist()
        for j, token in enumerate(cont):
            pos = len(prompt) + j - 1  # the row that predicts cont[j]
            proposal = lookup.propose(seq[: pos + 1])
            alone += guesses[pos] == token
            with_lookup += (proposal if proposal is not None else guesses[pos]) == token
            soft += kept[j]
            soft_lookup += float(p[j, proposal]) if proposal is not None else kept[j]
            total += 1
    total = max(total, 1)
    return {
        "agreement": round(alone / total, 4),
        "agreement_with_lookup": round(with_lookup / total, 4),
        "acceptance_t1": round(soft / total, 4),
        "acceptance_t1_with_lookup": round(soft_lookup / total, 4),
        "eval_tokens": int(total),
    }


TRAIN_THREADS = 2  # a draft's weights depend on the thread count: every draft is made with this many


@contextmanager
def fixed_threads():
    """Run a distillation with ``TRAIN_THREADS`` threads whatever the job has, so the same recipe makes the same
    weights on any machine (with the same library versions)."""
    before = torch.get_num_threads()
    torch.set_num_threads(TRAIN_THREADS)
    try:
        yield
    finally:
        torch.set_num_threads(before)
