"""The target's own text that the model cache already holds, for a job's corpus (``decoding/corpus.py``).

A draft distilled from the set's large model was trained on that model's data (``distill.stored_teacher_data``):
its greedy continuations of standard-library prompts and standard-library source it labelled, kept in the cache as
token ids. Those sequences are the corpus's fixed documents: no forward is run to make them, and none of them is a
benchmark's text. The held-out continuations stored beside them (HumanEval prompts, continued by the teacher to
measure a draft) are never read here: they are benchmark prompts' own outputs.
"""

from __future__ import annotations

from pathlib import Path

from ..files import read_tensors
from .cache import cache_dir
from .recipe import Recipe
from .resolve import recipe_for
from .sources import locate
from .spec import ModelError, ModelSpec, teacher_spec
from .teacher import data_name, token_ids


def teacher_data_files(specs: list[ModelSpec]) -> list[Path]:
    """The teacher-data files of the set's drafts that were distilled from the set's first model (its own
    greedy text), those present in the cache, each once."""
    target = specs[0]
    found: list[Path] = []
    for spec in specs[1:]:
        if not spec.distill:
            continue
        try:
            teacher = teacher_spec(spec)
            recipe = recipe_for(spec.distill, spec.name)
            same = teacher.name == target.name and locate(teacher) == locate(target)
        except ModelError:
            continue
        if not same or not isinstance(recipe, Recipe):  # a student with a tokenizer of its own: other ids
            continue
        path = cache_dir() / "teacher-data" / data_name(teacher, recipe)
        if path.is_file() and path not in found:
            found.append(path)
    return found


def teacher_documents(specs: list[ModelSpec], vocab: int) -> tuple[list[list[int]], str]:
    """The training sequences (token ids) of the set's teacher data (``teacher_data_files``), and where they came
    from as one line; none (and why) when the cache holds no such file, or one that cannot be read or holds other
    than token ids below ``vocab`` (the target's: a proposal outside it would reach the target's embedding)."""
    files = teacher_data_files(specs)
    if not files:
        return [], f"no teacher data of {specs[0].name} in the model cache (no draft of the set distilled from it)"
    documents: list[list[int]] = []
    for path in files:
        try:
            saved = read_tensors(path, "teacher data", mmap=True)  # the ids only are read; never "held"
            examples = saved["examples"] if isinstance(saved, dict) else None
            if not isinstance(examples, list) or not all(isinstance(e, tuple | list) and e for e in examples):
                raise ValueError("no examples of token ids")
            ids = [token_ids(e[0], vocab, f"example {n}'s ids") for n, e in enumerate(examples)]
            documents += [i.reshape(-1).tolist() for i in ids]
        except Exception as err:  # a damaged file, or other content: the corpus goes without it, and says so
            why = str(err) if isinstance(err, ValueError) else type(err).__name__
            return [], f"the teacher data {path.name} cannot be read ({why})"
    return documents, f"teacher data {', '.join(p.name for p in files)}: {len(documents)} sequences"
