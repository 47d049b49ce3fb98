"""A student with a tokenizer of its own: a model of another vocabulary than its teacher's, offline, in minutes.

The tokenizer is a byte-level BPE of a few thousand tokens, trained here (``tokenizers``) on the teacher's
own continuations of standard-library prompts plus standard-library source; it keeps the teacher's special
tokens (its EOS among them) and its chat template. The student is the teacher's first few decoder layers
with an embedding (tied head) for the new vocabulary, each row initialised from the teacher's embeddings
of that token's string as the teacher tokenizes it (mean-pooled), then trained by next-token cross-entropy
on the teacher's continuations under the student's tokenization (sequence-level distillation), with a few
chunks of standard-library source as plain text beside them. No benchmark data is trained on (as
``distill.py``).

Agreement is measured in string terms on held-out prompts continued by the teacher (``string_agreement``):
``agreement`` counts equal pieces, ``agreement_prefix`` pieces of which one is a prefix of the other (a piece that a
union decoder can continue consistently).
"""

from __future__ import annotations

import json
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from ..provenance import weights_versions
from .cache import META, save_dir
from .cpu_kernels import pack_linears
from .distill import digest
from .loading import truncated_copy
from .recipe import check_recipe
from .sources import cache_stem
from .spec import ModelError, ModelSpec
from .teacher import as_chat_turns, heldout_prompts, stdlib_files, stdlib_prompts, teacher_continuations
from .training import fit, fixed_threads


@dataclass
class StudentRecipe:
    layers: int = 2
    vocab: int = 4096  # the student tokenizer's size, special tokens included
    prompts: int = 48  # standard-library functions continued by the teacher (half as chat turns)
    new_tokens: int = 64
    source_files: int = 60  # standard-library files added to the tokenizer's training text
    source_chunks: int = 32  # chunks of that source (256 student tokens) also trained on, as plain text
    steps: int = 300
    lr: float = 2e-3
    warmup: int = 10
    batch: int = 16  # teacher generation batch
    eval_prompts: int = 8
    seed: int = 0

    def __post_init__(self):
        check_recipe(self, "student")


def recipe_from(settings: dict, name: str) -> StudentRecipe:
    """A recipe from a config's ``distill`` entry (``tokenizer: {vocab: N}`` and the other keys)."""
    args = {k: v for k, v in settings.items() if k not in ("teacher", "tokenizer")}
    tokenizer = settings.get("tokenizer") or {}
    if not isinstance(tokenizer, dict) or set(tokenizer) - {"vocab"}:
        raise ModelError(f"distill.tokenizer of {name!r}: {tokenizer!r}; accepted: {{vocab: <number of tokens>}}")
    vocab = tokenizer.get("vocab")
    if not isinstance(vocab, int) or isinstance(vocab, bool) or vocab < 300:
        raise ModelError(f"distill.tokenizer.vocab={vocab!r} for {name!r}: expected an integer of 300 or more")
    if args.get("loss", "ce") != "ce":
        raise ModelError(
            f"distill loss={args['loss']!r} for {name!r}: a student with a tokenizer of its own trains on its "
            "teacher's text (accepted: ce); the distribution losses need the teacher's vocabulary"
        )
    args.pop("loss", None)
    try:
        return StudentRecipe(**args, **tokenizer)
    except TypeError as err:
        raise ModelError(f"distill settings for {name!r}: {err}") from None


def train_tokenizer(texts: list[str], vocab: int, teacher_tokenizer):
    """A byte-level BPE of ``vocab`` tokens over ``texts``, with the teacher's special tokens and chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    specials = list(dict.fromkeys(teacher_tokenizer.all_special_tokens))
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab,
        special_tokens=specials,
        initial_alphabet=byte_alphabet(teacher_tokenizer),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer)
    roles = {
        f"{role}_token": getattr(teacher_tokenizer, f"{role}_token")
        for role in ("bos", "eos", "unk", "pad")
        if getattr(teacher_tokenizer, f"{role}_token", None) in specials
    }
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, **roles)
    fast.chat_template = getattr(teacher_tokenizer, "chat_template", None)
    return fast


def byte_alphabet(teacher_tokenizer) -> list[str]:
    """The single bytes the student's tokenizer starts from, as byte-level characters: those the teacher has a
    token for when it is byte-level itself (a byte-level BPE may leave out bytes that never occur in UTF-8,
    such as 0xC0; a student token holding one could not be spelt by its teacher, and the pair could not be
    joined), else all 256."""
    from tokenizers import pre_tokenizers

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = teacher_tokenizer.get_vocab()
    return [c for c in alphabet if c in vocab] if "Ġ" in vocab else alphabet


def student_model(base, teacher, teacher_tokenizer, tokenizer):
    """``base`` (the teacher's first layers, ``truncated_copy``) with an embedding (tied head) of ``tokenizer``'s
    vocabulary whose rows are the teacher's mean embedding of each token's string."""
    old = teacher.get_input_embeddings().weight.detach()
    specials = set(tokenizer.all_special_ids)
    rows = torch.empty(len(tokenizer), old.shape[1], dtype=old.dtype)
    for i in range(len(tokenizer)):
        piece = tokenizer.convert_ids_to_tokens(i) if i in specials else tokenizer.decode([i])
        ids = teacher_tokenizer(piece, add_special_tokens=False).input_ids or [teacher_tokenizer.unk_token_id or 0]
        rows[i] = old[ids].mean(0)
    base.config.tie_word_embeddings = True
    embed = torch.nn.Embedding(len(tokenizer), old.shape[1], dtype=old.dtype)
    embed.weight.data.copy_(rows)
    base.set_input_embeddings(embed)
    head = torch.nn.Linear(old.shape[1], len(tokenizer), bias=False, dtype=old.dtype)
    head.weight = embed.weight
    base.set_output_embeddings(head)
    base.config.vocab_size = len(tokenizer)
    for role in ("bos", "eos", "pad"):
        setattr(base.config, f"{role}_token_id", getattr(tokenizer, f"{role}_token_id"))
        if base.generation_config is not None:
            setattr(base.generation_config, f"{role}_token_id", getattr(tokenizer, f"{role}_token_id"))
    return base


def encode_pairs(tokenizer, pairs: list[tuple[str, str]]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(input ids, targets) per (prompt text, continuation text): targets only where a token starts in the
    continuation (-100 elsewhere)."""
    out = []
    for prompt, cont in pairs:
        enc = tokenizer(prompt + cont, return_offsets_mapping=True, add_special_tokens=False)
        ids = enc.input_ids
        starts = [start for start, _ in enc.offset_mapping]
        target = [t if s >= len(prompt) else -100 for t, s in zip(ids[1:], starts[1:])]
        if any(t >= 0 for t in target):
            out.append((torch.tensor([ids[:-1]]), torch.tensor(target)))
    return out


def source_examples(tokenizer, sources: list[str], count: int, size: int = 256):
    """(input ids, targets) of ``count`` chunks of source text, every position a target (two per file at most)."""
    out = []
    for text in sources:
        ids = tokenizer(text, add_special_tokens=False).input_ids
        for i in range(0, min(len(ids) - size, 2 * size), size):
            out.append((torch.tensor([ids[i : i + size]]), torch.tensor(ids[i + 1 : i + size + 1])))
        if len(out) >= count:
            break
    return out[:count]


def boundaries(tokenizer, ids: list[int], offset: int) -> dict[int, str]:
    """Character offset (from ``offset``) of each token of ``ids`` -> that token's string."""
    out, text = {}, ""
    for k in range(len(ids)):
        before = len(text)
        text = tokenizer.decode(ids[: k + 1])
        out[offset + before] = text[before:]
    return out


@torch.inference_mode()
def string_agreement(student, tokenizer, teacher_tokenizer, held: list[tuple[list[int], list[int]]]) -> dict:
    """How often the student's argmax piece is the teacher's next token (equal, or prefix-consistent), at the
    continuation's positions where both tokenizations have a boundary."""
    equal = prefix = total = 0
    for prompt_ids, cont_ids, *_ in held:  # (prompt, continuation[, the teacher's log-probabilities])
        prompt = teacher_tokenizer.decode(prompt_ids)
        teacher_next = boundaries(teacher_tokenizer, cont_ids, len(prompt))
        enc = tokenizer(prompt + teacher_tokenizer.decode(cont_ids), return_offsets_mapping=True)
        guesses = student(torch.tensor([enc.input_ids])).logits[0].argmax(-1).tolist()
        for k in range(len(enc.input_ids) - 1):
            at = enc.offset_mapping[k + 1][0]  # where the token that row k predicts starts
            if at < len(prompt) or at not in teacher_next:
                continue
            piece, truth = tokenizer.decode([guesses[k]]), teacher_next[at]
            equal += piece == truth
            prefix += bool(piece) and bool(truth) and (piece.startswith(truth) or truth.startswith(piece))
            total += 1
    return {
        "agreement": round(equal / max(total, 1), 4),
        "agreement_prefix": round(prefix / max(total, 1), 4),
        "eval_positions": total,
    }


def distill_student(teacher, teacher_tokenizer, out_dir: Path, recipe: StudentRecipe, teacher_name: str) -> Path:
    """Build, train, measure and save a student with its own tokenizer; returns its directory.

    ``teacher`` must have plain ``nn.Linear`` layers (``load(..., pack=False)``).
    """
    with fixed_threads():
        return _distill_student(teacher, teacher_tokenizer, out_dir, recipe, teacher_name)


def _distill_student(teacher, teacher_tokenizer, out_dir: Path, recipe: StudentRecipe, teacher_name: str) -> Path:
    t0 = time.perf_counter()
    torch.manual_seed(recipe.seed)
    base = truncated_copy(teacher, recipe.layers)  # before packing: the student's layers must stay trainable
    if teacher.dtype == torch.float32 and teacher.device.type == "cpu":
        pack_linears(teacher)  # the teacher only runs inference from here: generation 2x faster
    rng = random.Random(recipe.seed)
    files = stdlib_files(rng)
    prompts = sorted(stdlib_prompts(files, 2 * recipe.prompts, rng), key=len)[: recipe.prompts]  # the shorter half:
    # batches of like lengths, little padding (the teacher's generation is most of the recipe's time)
    prompts = as_chat_turns(prompts, teacher_tokenizer, 2)  # half as chat turns: the instruct model's use
    pairs = teacher_continuations(
        teacher, teacher_tokenizer, prompts, recipe.new_tokens, recipe.batch, "teacher continues"
    )
    decode = teacher_tokenizer.decode
    generated = [(decode(p), decode(c, skip_special_tokens=True)) for p, c, _ in pairs if c]  # (prompt, continuation)
    sources = []
    for path in files[-recipe.source_files :] if recipe.source_files else []:
        try:
            sources.append(path.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, OSError):
            continue
    t_tok = time.perf_counter()
    facts = {"teacher_seconds": round(t_tok - t0, 1)}
    tokenizer = train_tokenizer([p + c for p, c in generated] + sources, recipe.vocab, teacher_tokenizer)
    facts.update(tokenizer_seconds=round(time.perf_counter() - t_tok, 1), vocab=len(tokenizer))
    student = student_model(base, teacher, teacher_tokenizer, tokenizer)
    examples = encode_pairs(tokenizer, generated) + source_examples(tokenizer, sources, recipe.source_chunks)
    if not examples:
        raise ModelError(f"the teacher {teacher_name!r} continued no prompt: nothing to train a student on")

    def loss(example, step):
        ids, target = example
        return torch.nn.functional.cross_entropy(student(input_ids=ids, use_cache=False).logits[0], target)

    facts.update(fit(student, list(student.parameters()), examples, recipe, loss, "train student"))
    held = teacher_continuations(
        teacher, teacher_tokenizer, heldout_prompts(recipe.eval_prompts), recipe.new_tokens, recipe.batch, "held-out"
    )
    facts.update(string_agreement(student, tokenizer, teacher_tokenizer, held))
    seconds = round(time.perf_counter() - t0, 1)
    facts.update(train_sequences=len(examples), versions=weights_versions(), total_seconds=seconds)
    meta = {"teacher": teacher_name, "kind": "student", "recipe": asdict(recipe), **facts}
    save_dir(student, tokenizer, out_dir, {META: json.dumps(meta, indent=2)})
    return out_dir


def student_name(teacher: ModelSpec, recipe: StudentRecipe) -> str:
    """The cache name of a student: readable, plus a hash of the whole recipe and the teacher's identity."""
    return f"{cache_stem(teacher)}-student-L{recipe.layers}-v{recipe.vocab}-s{recipe.seed}-{digest(teacher, recipe)}"
