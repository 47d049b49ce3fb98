"""A draft's recipe (``Recipe``: its layers, head, teacher data, steps and loss), checked when it is made
(``check_recipe``, for students too), and the losses a recipe may name (``LOSSES``)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from .spec import ModelError

LOSSES = {  # a draft's training loss -> what it fits
    "ce": "cross-entropy to the teacher's argmax",
    "kl": "forward KL to the teacher's distribution over the head's tokens",
    "tvd": "total variation to the teacher's distribution (1 - sum of min(p, q): the rejection rate at T=1)",
    "kl_tvd": "forward KL for the first half of the steps, then total variation (KL's gradient to reach the "
    "teacher's mass, TV's to fit the rejection rate itself)",
}


@dataclass
class Recipe:
    layers: int = 2
    head_tokens: int = 4096  # 0: the full vocabulary
    prompts: int = 64  # standard-library functions continued by the teacher
    new_tokens: int = 96
    source_chunks: int = 16  # raw standard-library source chunks
    chunk_tokens: int = 512
    steps: int = 400
    lr: float = 3e-3
    warmup: int = 10
    loss: str = "ce"  # one of LOSSES
    chat_every: int = 0  # every Nth on-policy prompt (from the second) as a chat turn: the instruct model's use
    batch: int = 16  # teacher generation batch
    eval_prompts: int = 16
    seed: int = 0

    def __post_init__(self):
        check_recipe(self, "draft")


def check_recipe(recipe, what: str) -> None:
    """One line naming the first value of a draft's or student's recipe that cannot train (``ModelError``)."""
    loss = getattr(recipe, "loss", "ce")
    if loss not in LOSSES:
        raise ModelError(f"distill loss={loss!r} for a {what}: accepted: {', '.join(LOSSES)}")
    for key in ("layers", "steps", "prompts", "new_tokens", "batch", "eval_prompts"):
        value = getattr(recipe, key)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ModelError(f"distill {key}={value!r} for a {what}: expected an integer of 1 or more")
    for key in ("head_tokens", "source_chunks", "warmup", "seed", "chat_every"):
        value = getattr(recipe, key, 0)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ModelError(f"distill {key}={value!r} for a {what}: expected an integer of 0 or more")
    lr = recipe.lr
    if isinstance(lr, bool) or not isinstance(lr, int | float) or not math.isfinite(lr) or not 0 < lr <= 1:
        raise ModelError(f"distill lr={lr!r} for a {what}: expected a number in (0, 1]")
