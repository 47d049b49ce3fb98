"""A model spec made ready: converted, fetched or distilled on first use, then loaded."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from .cache import cache_dir, cache_lock
from .distill import META, Recipe, distill, draft_name
from .loading import check_tokenizers, load
from .sources import bundled_dir, gguf_dir, hub_dir, locate
from .spec import ModelError, ModelSpec


def resolve(spec: ModelSpec, cache: Path | None = None) -> Path:
    """A local model directory for ``spec`` (converted, fetched or distilled on first use)."""
    kind, where = locate(spec)
    if kind == "distill":
        args = {k: v for k, v in spec.distill.items() if k != "teacher"}
        try:
            recipe = Recipe(**args)
        except TypeError as err:
            raise ModelError(f"distill settings for {spec.name!r}: {err}") from None
        return ensure_draft(where, recipe)
    if kind == "bundled":
        return bundled_dir(cache)
    if kind == "gguf":
        return gguf_dir(where, spec.name, cache)
    if kind == "hub":
        return hub_dir(where)
    return where


def load_spec(spec: ModelSpec):
    return load(resolve(spec), spec.resolved_dtype(), spec.resolved_device(), spec.full_head, spec.pack)


def load_set(specs: list[ModelSpec]):
    """Load a model set (one, a pair, a triple) and check that it shares one tokenizer."""
    loaded = [load_spec(s) for s in specs]
    check_tokenizers([s.name for s in specs], [tok for _, tok in loaded])
    return [m for m, _ in loaded], loaded[0][1]


def ensure_draft(teacher: str | ModelSpec, recipe: Recipe, force: bool = False, out_dir: Path | None = None) -> Path:
    """The distilled draft's directory, distilled on first use and cached after.

    ``teacher`` is a model name (resolved like any model) or a full spec (a model of the config, with its source).
    """
    spec = teacher if isinstance(teacher, ModelSpec) else ModelSpec(teacher)
    out = out_dir or cache_dir() / "drafts" / draft_name(spec, recipe)
    if (out / META).exists() and not force:
        return out
    with cache_lock(out):
        if (out / META).exists() and not force:  # distilled by another job while this one waited
            return out
        model, tokenizer = load_spec(dataclasses.replace(spec, pack=False))
        print(f"distilling {out.name} from {spec.name} (once; a few minutes on a CPU)", flush=True)
        return distill(model, tokenizer, out, recipe, spec.name)
