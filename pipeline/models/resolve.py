"""A model spec made ready: converted, fetched or distilled on first use, then loaded."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from ..decoding.checks import head_rows
from .cache import META, cache_dir, cache_lock
from .distill import digest, distill, draft_name
from .feature_head import HeadRecipe
from .head_target import ensemble_target, member_spec
from .head_training import distill_head
from .loading import check_tokenizers, first_different, load
from .recipe import Recipe
from .sources import bundled_dir, cache_stem, gguf_dir, hub_dir, locate
from .spec import ModelError, ModelSpec
from .student import StudentRecipe, distill_student, recipe_from, student_name
from .teacher import data_name


def resolve(spec: ModelSpec, cache: Path | None = None) -> Path:
    """A local model directory for ``spec`` (converted, fetched or distilled on first use)."""
    kind, where = locate(spec)
    if kind == "distill":
        return ensure_draft(where, recipe_for(spec.distill, spec.name))
    if kind == "bundled":
        return bundled_dir(cache)
    if kind == "gguf":
        return gguf_dir(where, spec.name, cache)
    if kind == "hub":
        return hub_dir(where)
    return where


def recipe_for(settings: dict, name: str) -> Recipe | StudentRecipe:
    """The recipe of a model's ``distill`` entry: a student's when it names a tokenizer of its own, else a
    draft's; one line (``ModelError``) naming a key or value that cannot train."""
    if "tokenizer" in settings:
        return recipe_from(settings, name)
    return recipe_of(Recipe, {k: v for k, v in settings.items() if k != "teacher"}, f"distill settings for {name!r}")


def recipe_of(cls: type, settings: dict, what: str):
    """``cls(**settings)`` (a recipe dataclass), or one line naming the first key it does not take."""
    accepted = [f.name for f in dataclasses.fields(cls)]
    unknown = sorted(set(settings) - set(accepted), key=str)
    if unknown:
        raise ModelError(f"{what}: unknown key {unknown[0]!r}; accepted: {', '.join(accepted)}")
    return cls(**settings)


def load_spec(spec: ModelSpec):
    """The model and its tokenizer, with its feature head attached when the spec names one (``eagle``)."""
    model, tokenizer = load(
        resolve(spec), spec.resolved_dtype(), spec.resolved_device(), spec.full_head, spec.pack, spec.runner
    )
    if spec.eagle is not None:
        from .head_files import load_head

        load_head(ensure_head(spec), model)
    return model, tokenizer


def head_recipe(spec: ModelSpec) -> HeadRecipe:
    """The recipe of a model's ``eagle`` entry when it is one (a dict); one line naming a key it cannot take."""
    settings = spec.eagle if isinstance(spec.eagle, dict) else {}
    return recipe_of(HeadRecipe, settings, f"eagle settings for {spec.name!r}")


def ensure_head(spec: ModelSpec) -> Path:
    """The directory of a model's feature head: the one its ``eagle`` names, or one trained from the model on
    first use (its recipe hashed into the cache name, as a draft's) and cached after."""
    if isinstance(spec.eagle, str):
        path = Path(spec.eagle).expanduser()
        if not path.is_dir():
            raise ModelError(f"eagle={spec.eagle!r} for model {spec.name!r}: no such directory")
        return path
    recipe = head_recipe(spec)
    plain = dataclasses.replace(spec, eagle=None)
    out = cache_dir() / "heads" / f"{cache_stem(plain)}-eagle-L{recipe.layers}-s{recipe.seed}-{digest(plain, recipe)}"
    if (out / META).exists():
        return out
    with cache_lock(out):
        if not (out / META).exists():
            teacher, tokenizer = load_spec(dataclasses.replace(plain, pack=False))
            members = ensemble_members(spec, recipe, tokenizer)
            print(f"training the feature head {out.name} of {spec.name} (once; a few minutes on a CPU)", flush=True)
            store = cache_dir() / "teacher-data" / data_name(plain, recipe)  # shared by heads of the same data
            distill_head(teacher, tokenizer, out, recipe, spec.name, members, data_store=store)
    return out


def ensemble_members(spec: ModelSpec, recipe: HeadRecipe, tokenizer) -> tuple:
    """The other members of the ensemble a head's recipe is trained for, loaded (float32, as a teacher), each
    sharing the head's model's tokenizer; () for a head of its model alone."""
    target = ensemble_target(recipe.target)
    if target is None:
        return ()
    specs = [member_spec(m) for m in target.members]
    loaded = [load_spec(dataclasses.replace(m, pack=False, dtype="float32", eagle=None)) for m in specs]
    check_tokenizers([spec.name, *(m.name for m in specs)], [tokenizer, *(tok for _, tok in loaded)])
    return tuple(model for model, _ in loaded)


def load_set(specs: list[ModelSpec]):
    """Load a model set (one, a pair, a triple) and check that it shares one tokenizer."""
    models, tokenizers = load_members(specs)
    check_tokenizers([s.name for s in specs], tokenizers)
    return models, tokenizers[0]


def load_members(specs: list[ModelSpec]):
    """Load a model set whose members may tokenize differently: its models and one tokenizer per model."""
    loaded = [load_spec(s) for s in specs]
    return [m for m, _ in loaded], [tok for _, tok in loaded]


def tokenizer_rows(tokenizer) -> int:
    """The head rows a tokenizer's ids reach: its largest id (added tokens included) plus one."""
    return max(tokenizer.get_vocab().values()) + 1


def token_rows(models: list, tokenizer) -> int | None:
    """For a set sharing ``tokenizer``: the rows every method decodes over when a head is padded past the
    tokenizer (rows no token maps to, as Qwen2.5-7B's 152,064 beside Qwen2.5-0.5B's 151,936 for 151,665
    tokens): the rows its ids reach (``tokenizer_rows``), so that the padding is cropped and the set is one
    vocabulary whatever each head's padding. None where no head is padded."""
    size, heads = tokenizer_rows(tokenizer), [head_rows(m) for m in models]
    if size > min(heads):
        raise ModelError(
            f"the tokenizer's ids reach {size - 1} but a model's head scores {min(heads)} rows: the tokenizer "
            "and the weights are from different models"
        )
    return size if max(heads) > size else None


def decode_vocabulary(models: list, tokenizers: list) -> dict[str, Any]:
    """What ``generate`` takes to decode a loaded set over one vocabulary: every member's tokenizer where they
    differ (their union); where they share one and a head is padded, the rows its ids reach (``token_rows``)."""
    if first_different(tokenizers) is not None:
        return {"tokenizers": list(tokenizers)}
    rows = token_rows(models, tokenizers[0])
    return {} if rows is None else {"vocab_size": rows}


def ensure_draft(
    teacher: str | ModelSpec, recipe: Recipe | StudentRecipe, force: bool = False, out_dir: Path | None = None
) -> Path:
    """The distilled draft's (or student's, for a ``StudentRecipe``) directory, distilled on first use and cached after.

    ``teacher`` is a model name (resolved like any model) or a full spec (a model of the config, with its source).
    """
    spec = teacher if isinstance(teacher, ModelSpec) else ModelSpec(teacher)
    student = isinstance(recipe, StudentRecipe)
    out = out_dir or cache_dir() / "drafts" / (student_name if student else draft_name)(spec, recipe)
    if (out / META).exists() and not force:
        return out
    with cache_lock(out):
        if (out / META).exists() and not force:  # distilled by another job while this one waited
            return out
        # float32 whatever the teacher's dtype: a draft trained in bfloat16 loses AdamW's small steps
        model, tokenizer = load_spec(dataclasses.replace(spec, pack=False, dtype="float32"))
        print(f"distilling {out.name} from {spec.name} (once; a few minutes on a CPU)", flush=True)
        if student:
            return distill_student(model, tokenizer, out, recipe, spec.name)
        store = cache_dir() / "teacher-data" / data_name(spec, recipe)  # shared by the drafts of one teacher's data
        return distill(model, tokenizer, out, recipe, spec.name, data_store=store)
