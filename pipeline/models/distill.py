"""Distil a small draft from a teacher, offline, in minutes on a CPU, the same draft on every machine.

The draft is the teacher's first few decoder layers, trained on the teacher's next-token predictions by one of
``LOSSES``: cross-entropy to its argmax (``ce``), or its whole distribution (``kl``: forward KL, ``tvd``: total
variation, the rejection rate of speculative sampling itself). Embeddings and output head stay the teacher's,
shared and frozen. Optionally the head scores only the teacher's most frequently predicted tokens
(``head_tokens``), which makes the draft several times cheaper while keeping speculative decoding lossless.

Training is bounded by steps, never by time, and seeded: the same recipe and teacher make the same weights
beside any other load (the same library versions and thread count). Training text contains no benchmark data:
prompts are signatures and docstrings of public functions in the Python standard library, continued by the
teacher itself (on-policy), plus chunks of standard-library source. Acceptance is measured on held-out
HumanEval prompts (``acceptance``). docs/proposers.md has the recipe, the losses and the learning curve. The recipe
is ``recipe.py``'s, the teacher's data ``teacher.py``'s, the training loop ``training.py``'s.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import asdict
from pathlib import Path

import torch

from ..errors import UserError
from ..provenance import weights_versions
from .cache import META, save_dir
from .cpu_kernels import pack_linears
from .loading import truncated_copy
from .recipe import Recipe
from .restricted import RestrictedHeadLM
from .sources import cache_stem, locate
from .spec import ModelError, ModelSpec
from .teacher import Example, TeacherData, stored_teacher_data
from .training import acceptance, draft_loss, fit, fixed_threads, loss_at

HEAD_FILE = "head_tokens.json"


def train(draft: RestrictedHeadLM, examples: list[Example], recipe: Recipe, probe=None) -> dict:
    """The draft's layers trained on ``examples`` by ``recipe.loss``; returns training facts."""
    if recipe.loss == "ce":
        examples = [e for e in examples if (e.labels >= 0).any()]
    base = draft.base
    draft.requires_grad_(False)
    trainable = [p for layer in base.model.layers for p in layer.parameters()] + list(base.model.norm.parameters())

    def loss(example: Example, step: int) -> torch.Tensor:
        example = example.to(base.device)
        hidden = base.model(input_ids=example.ids, use_cache=False).last_hidden_state[0]
        return draft_loss(loss_at(recipe.loss, step, recipe.steps), draft.head_logits(hidden), example)

    return fit(base, trainable, examples, recipe, loss, "train draft", probe)


def distill(
    teacher, tokenizer, out_dir: Path, recipe: Recipe, teacher_name: str = "teacher", data_store: Path | None = None
) -> Path:
    """Build, train, measure and save a draft; returns its directory. ``data_store``: the file that keeps the
    teacher's data for other drafts of the same data (``stored_teacher_data``).

    ``teacher`` must have plain ``nn.Linear`` layers (``load(..., pack=False)``); on a CPU
    it is packed in place once the draft's layers are copied.
    """
    with fixed_threads():
        return _distill(teacher, tokenizer, out_dir, recipe, teacher_name, data_store)


def _distill(teacher, tokenizer, out_dir: Path, recipe: Recipe, teacher_name: str, data_store: Path | None) -> Path:
    t0 = time.perf_counter()
    torch.manual_seed(recipe.seed)
    base = truncated_copy(teacher, recipe.layers)  # before packing: the draft's layers must stay trainable
    if teacher.dtype == torch.float32 and teacher.device.type == "cpu":
        pack_linears(teacher)  # the teacher only runs inference here: generation and labels 2x faster
    data = stored_teacher_data(teacher, tokenizer, recipe, data_store)
    draft, facts = train_draft(base, data, recipe)
    facts["total_seconds"] = round(time.perf_counter() - t0, 1)
    meta = {"teacher": teacher_name, "recipe": asdict(recipe), **facts}
    files = {META: json.dumps(meta, indent=2)}
    if len(data.kept) < draft.vocab_size:
        files[HEAD_FILE] = json.dumps(data.kept)
    save_dir(draft.base, tokenizer, out_dir, files)
    return out_dir


def train_draft(base, data: TeacherData, recipe: Recipe, curve: bool = False) -> tuple[RestrictedHeadLM, dict]:
    """``base`` (the teacher's first layers, ``truncated_copy``; trained in place) with the head's kept ids,
    trained and measured: the draft and its facts (``curve``: also its held-out acceptance every 50 steps)."""
    draft = RestrictedHeadLM(base, data.kept)
    probe = (lambda step: acceptance(draft, data.held)) if curve else None
    facts = train(draft, data.examples, recipe, probe)
    facts.update(acceptance(draft, data.held))
    facts.update(label_coverage=round(data.label_coverage, 4), train_sequences=len(data.examples))
    facts.update(teacher_seconds=data.seconds, versions=weights_versions())
    return draft, facts


def draft_name(teacher: ModelSpec, recipe: Recipe) -> str:
    """The cache name of a draft: readable, plus a hash of the whole recipe and the teacher's spec
    (another teacher source or another step count is another draft)."""
    head = f"h{recipe.head_tokens}" if recipe.head_tokens else "full"
    return f"{cache_stem(teacher)}-draft-L{recipe.layers}-{head}-s{recipe.seed}-{digest(teacher, recipe)}"


def digest(teacher: ModelSpec, recipe) -> str:
    """A hash of the whole recipe and the teacher's identity, however it was named ('bundled' or by name)."""
    where = locate(teacher)
    key = json.dumps({"recipe": asdict(recipe), "teacher": [where[0], str(where[1])]}, sort_keys=True)
    return hashlib.sha256(key.encode()).hexdigest()[:8]


def read_meta(path: Path) -> dict:
    """The record (``draft.json``) of a draft, student or head in directory ``path``, checked (``records.py``)."""
    from ..records import read_record

    try:
        return read_record(Path(path) / META, "draft.json", "the draft's record")
    except UserError as err:
        raise ModelError(f"{err}; delete {path} to make it again") from None
