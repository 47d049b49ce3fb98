"""Models: specs and sources, the cache, distilled drafts, restricted heads and CPU kernels.

A model is a name plus a source (``sources.locate``: a local directory,
``MODEL_PATH/<name>``, a hub id, a GGUF file, ``bundled``, or a draft distilled
from another model). Modules depend downwards only: ``spec`` and ``cache``;
``sources``; ``restricted``, ``cpu_kernels`` and ``loading``; ``distill``;
``resolve``, which makes a spec ready (converted, fetched or distilled) and
loads it.
"""

from .distill import distill, read_meta
from .loading import check_tokenizers, load, load_bundled, truncated_copy
from .recipe import Recipe
from .resolve import (
    decode_vocabulary,
    ensure_draft,
    load_members,
    load_set,
    load_spec,
    resolve,
    token_rows,
    tokenizer_rows,
)
from .sources import bundled_dir, bundled_gguf, locate
from .spec import BUNDLED, ModelError, ModelSpec, config_entry, default_models, parse_model
