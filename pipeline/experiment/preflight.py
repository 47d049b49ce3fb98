"""Preflight: a config's models and model sets checked from their files alone (``models/files.py``), before any job.

For each model set: one vocabulary and one tokenizer (the decoder needs them shared), chat templates where a
dataset asks for one, full heads where a method needs them, and, where the GPU is known, the memory of the set's
weights in their dtype plus a KV cache against the GPU's. Every problem is one line; all are reported at once.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..decoding.joined import one_tokenizer_problem
from ..engines import behaviour
from ..models.files import ModelInfo, inspect_config

if TYPE_CHECKING:
    from .cell import CellFile


def set_problems(config: dict[str, Any], cells: dict[str, CellFile], infos: dict[str, ModelInfo]) -> list[str]:
    """What stops a model set from running: vocabularies, tokenizers, chat templates, full heads."""
    problems: dict[str, None] = {}
    joined: set[tuple[str, ...]] = set()  # sets whose members are compared already
    for c in cells.values():
        cell, dims = c.cell, c.dims
        names = dims.models
        where = f"grid {dims.grid!r}, set {dims.model_set!r}"
        differ = different_tokenizers(config, names, infos)
        if differ and (why := one_tokenizer_problem(dims.spec)):
            problems[
                f"{where}: {dims.method!r} needs one shared tokenizer but {differ} ({why}); the other methods "
                "run over the union of their vocabularies"
            ] = None
        elif differ and tuple(names) not in joined:
            joined.add(tuple(names))
            if problem := joinable_problem(names, infos):
                problems[f"{where}: {problem}"] = None
        elif all(infos[n].vocab_size for n in names):
            try:
                dims.spec.check_heads([infos[n].vocab_size for n in names])
            except ValueError as err:
                problems[f"{where}: {err}"] = None
        if cell.chat:
            for name in names:
                if infos[name].vocab is not None and not infos[name].chat_template:
                    problems[
                        f"config key datasets.{dims.dataset}: chat is true but model {name!r} has no chat template "
                        "(tokenizer_config.json chat_template); set chat: false or use an instruct model"
                    ] = None
        if problem := engine_problem(dims, infos):
            problems[f"{where}: {problem}"] = None
        restricted = [repr(n) for n in names if infos[n].restricted_head]
        try:
            dims.spec.check(len(names), cell.method_args, restricted)
        except ValueError as err:
            problems[f"{where}: {err}; or set 'full_head: true' on that model"] = None
    return list(problems)


def engine_problem(dims, infos: dict[str, ModelInfo]) -> str | None:
    """What the cell's engine cannot load of its models (their config.json architectures against the engine's
    model classes: vLLM's, as built), or None."""
    from ..decoding.proposers import DRAFT

    engine = dims.spec.engine
    loaded = dims.models[:2] if dims.spec.peer_proposer == DRAFT else dims.models[:1]
    for name in loaded:
        config = infos[name].config or {}
        if missing := behaviour(engine).cannot_load(list(config.get("architectures") or [])):
            return (
                f"{dims.method!r} runs {engine.title}, which has no model class for {missing[0]} (model {name!r}, "
                f"config.json architectures); use a model {engine.title} supports, or our own methods"
            )
    return None


def own_tokenizer(model: dict[str, Any]) -> bool:
    """A config model that is a student with a tokenizer of its own (``distill: {tokenizer: ...}``)."""
    return "tokenizer" in (model.get("distill") or {})


def mixed_tokenizers(models: dict[str, Any], names: list[str]) -> bool:
    """Whether the config alone shows that a set's members tokenize differently: a student with a tokenizer of
    its own beside any other model (other sets are told apart by their files, in the preflight)."""
    return len(set(names)) > 1 and any(own_tokenizer(models[n]) for n in names)


def different_tokenizers(config: dict[str, Any], names: list[str], infos: dict[str, ModelInfo]) -> str | None:
    """How a set's members tokenize differently, in words (None: one shared tokenizer, as far as is known)."""
    first = infos[names[0]]
    for name in names[1:]:
        other = infos[name]
        known = first.vocab is not None and other.vocab is not None
        if known and first.vocab == other.vocab:  # one tokenizer: heads padded to other sizes are cropped to it
            continue  # (models.token_rows), one vocabulary
        if first.vocab_size and other.vocab_size and first.vocab_size != other.vocab_size:
            return (
                f"{names[0]!r} has a vocabulary of {first.vocab_size} and {name!r} of {other.vocab_size} "
                "(config.json vocab_size)"
            )
        if known:
            return (
                f"{names[0]!r} and {name!r} have different tokenizers (vocabularies of {len(first.vocab)} and "
                f"{len(other.vocab)} tokens)"
            )
    if mixed_tokenizers(config["models"], names):
        return f"{', '.join(map(repr, names))} tokenize differently (a student with a tokenizer of its own)"
    return None


def joinable_problem(names: list[str], infos: dict[str, ModelInfo]) -> str | None:
    """Why the union decoder cannot join a set of different tokenizers, read from their files (None: it can,
    or a member is not on this machine yet: the job checks it then)."""
    if any(infos[n].path is None or infos[n].vocab is None for n in names):
        return None
    from transformers import AutoTokenizer

    from ..decoding.union import check_joinable
    from ..errors import UserError

    try:
        check_joinable([AutoTokenizer.from_pretrained(infos[n].path) for n in names], names)
    except UserError as err:
        return str(err)
    return None


def models_to_prepare(config: dict[str, Any], cells: dict[str, CellFile]) -> list[str]:
    """Model names used by some cell, in config order."""
    used = {m for c in cells.values() for m in c.dims.models}
    return [m for m in config["models"] if m in used]


def run(config: dict[str, Any], cells: dict[str, CellFile], gpu: str | None = None):
    """The models' infos and every problem of a checked config (``gpu``: a name of ``estimate.GPUS``)."""
    infos = inspect_config(config, models_to_prepare(config, cells), "bfloat16" if gpu != "cpu" else "float32")
    problems = [p for info in infos.values() for p in info.problems]
    problems += set_problems(config, cells, infos)
    if gpu is not None:
        from .estimate import gpu_spec, memory_problems

        memory = gpu_spec(gpu).memory_gb
        problems += memory_problems(cells, infos, memory, f"one {gpu} ({memory:g} GB)")
    return infos, list(dict.fromkeys(problems))


def table(infos: dict[str, ModelInfo]) -> list[str]:
    rows = ["| model | resolves to | parameters | vocabulary | tokenizer | chat template | weights |", "|---" * 7 + "|"]
    for i in infos.values():
        params = f"{i.parameters / 1e9:.2f}B" if i.parameters else "?"
        weights = f"{i.weight_bytes() / 1e9:.1f} GB {i.dtype}" if i.parameters else "?"
        tok = f"{len(i.vocab)} tokens" if i.vocab is not None else "missing" if i.path else "?"
        chat = "yes" if i.chat_template else "no" if i.vocab is not None else "?"
        rows.append(f"| {i.name} | {i.where} | {params} | {i.vocab_size or '?'} | {tok} | {chat} | {weights} |")
    return rows
