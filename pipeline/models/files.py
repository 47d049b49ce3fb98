"""What a model's files say, before any job: where its name resolves (the order of ``models.sources.locate``: a
local directory, ``MODEL_PATH/<name>``, ``MODEL_PATH/<repo name>``, the local hub cache, a GGUF file, the bundled
model, a draft distilled from a teacher), its ``config.json`` and its tokenizer, never its weights."""

from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import UserError, one_line
from ..files import read_user_json
from ..records import read_record
from .config_json import config_json_problems
from .spec import BUNDLED, DTYPES, ModelError, ModelSpec, config_entry, teacher_spec

TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json")


@dataclass
class ModelInfo:
    """What a model's files say: where it resolves, its config.json and tokenizer, or why it cannot."""

    name: str
    where: str  # how the name resolves, for a person
    path: Path | None = None  # the directory read (None: nothing local to read yet)
    config: dict[str, Any] | None = None  # config.json (a distilled draft's: its teacher's, fewer layers)
    vocab: dict[str, int] | None = None  # the tokenizer's vocabulary
    chat_template: bool = False
    restricted_head: bool = False
    head_tokens: int | None = None  # a restricted head's size (the ids it scores)
    dtype: str = "bfloat16"
    problems: list[str] = field(default_factory=list)
    _shapes: tuple[int, int] | None = None

    @property
    def vocab_size(self) -> int | None:
        return (self.config or {}).get("vocab_size")

    @property
    def parameters(self) -> int | None:
        """Parameters from config.json's shapes (a model built on the meta device: no memory, no weights)."""
        if self._shapes is None and self.config is not None:
            self._shapes = count_parameters(self.config)
        return None if self._shapes is None else self._shapes[0]

    def weight_bytes(self) -> int | None:
        return None if self.parameters is None else self.parameters * DTYPES[self.dtype].itemsize

    def read_bytes(self) -> int | None:
        """Bytes of weights a forward of one token reads: all but an untied input embedding (one row is read)
        and the rows a restricted head leaves out."""
        if self.parameters is None:
            return None
        skipped = self._shapes[1]
        if self.restricted_head and self.head_tokens:
            skipped += (self.vocab_size - self.head_tokens) * self.config.get("hidden_size", 0)
        return (self.parameters - skipped) * DTYPES[self.dtype].itemsize

    def kv_bytes(self, tokens: int) -> int:
        """The KV cache of ``tokens`` positions (at most the model's context), in the model's dtype."""
        c = self.config or {}
        layers, heads = c.get("num_hidden_layers", 0), c.get("num_attention_heads", 1)
        kv_heads = c.get("num_key_value_heads") or heads
        head_dim = c.get("head_dim") or c.get("hidden_size", 0) // heads
        tokens = min(tokens, c.get("max_position_embeddings") or tokens)
        return 2 * layers * kv_heads * head_dim * tokens * DTYPES[self.dtype].itemsize


def count_parameters(config: dict[str, Any]) -> tuple[int, int]:
    """Parameters of a model of this config.json, and those of its input embedding when it is not tied to
    the output head."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = dict(config)
    cfg.pop("quantization_config", None)
    model_type = cfg.pop("model_type", "llama")
    try:
        built = AutoConfig.for_model(model_type, **{k: v for k, v in cfg.items() if k != "transformers_version"})
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(built)
    except (ValueError, KeyError, TypeError) as err:  # an architecture this transformers does not know
        raise ModelError(f"config.json of model_type {model_type!r}: {one_line(err)}") from None
    embedding, head = model.get_input_embeddings().weight, model.get_output_embeddings().weight
    return sum(p.numel() for p in model.parameters()), 0 if embedding is head else embedding.numel()


def read_dir(info: ModelInfo, path: Path) -> ModelInfo:
    """Read a model directory's config.json and tokenizer files into ``info``."""
    info.path = path
    try:
        config = read_user_json(path / "config.json", "model config")  # bounded; a link followed (a HF cache)
    except (UserError, ValueError) as err:  # ValueError: not JSON, or not UTF-8
        info.problems.append(f"config key models.{info.name}: {path}/config.json cannot be read ({one_line(err)})")
        return info
    if problems := config_json_problems(config, f"config key models.{info.name}: {path}/config.json"):
        info.problems += problems  # nothing is built from a config.json that cannot describe a model
        return info
    info.config = config
    head_file = path / "head_tokens.json"
    if head_file.exists():
        info.restricted_head = True
        with contextlib.suppress(UserError):  # unreadable: the loader refuses it in one line
            info.head_tokens = len(read_record(head_file, "head_tokens.json", "restricted head"))
    present = [f for f in TOKENIZER_FILES if (path / f).exists()]
    if not present:
        info.problems.append(
            f"config key models.{info.name}: {path} has no tokenizer ({', '.join(TOKENIZER_FILES)}); "
            "copy its repository's tokenizer files there"
        )
        return info
    try:
        info.vocab = read_vocab(path, present[0])
    except Exception as err:  # noqa: BLE001 (tokenizer readers raise many kinds: a damaged file, a missing library)
        info.problems.append(f"config key models.{info.name}: its tokenizer in {path} cannot be read: {one_line(err)}")
        return info
    tok_config = path / "tokenizer_config.json"
    if tok_config.exists():
        try:
            found = read_record(tok_config, "tokenizer_config.json", f"config key models.{info.name}:")
        except UserError as err:  # not JSON, not an object, a chat template that is not text: nothing renders
            info.problems.append(str(err))
            return info
        info.chat_template = bool(found.get("chat_template"))
    info.chat_template |= any((path / f).exists() for f in ("chat_template.jinja", "chat_template.json"))
    if info.vocab_size and len(info.vocab) > info.vocab_size:
        info.problems.append(
            f"config key models.{info.name}: its tokenizer has {len(info.vocab)} tokens but config.json's "
            f"vocab_size is {info.vocab_size}; the tokenizer and the weights are from different models"
        )
    return info


@functools.lru_cache(maxsize=64)  # a teacher's files serve its drafts too
def read_vocab(path: Path, first: str) -> dict[str, int]:
    if first == "tokenizer.json":
        from tokenizers import Tokenizer

        return Tokenizer.from_file(str(path / first)).get_vocab(with_added_tokens=True)
    from transformers import AutoTokenizer  # a sentencepiece or BPE-files tokenizer: slower, still no weights

    return AutoTokenizer.from_pretrained(path).get_vocab()


def inspect(spec: ModelSpec, dtype: str = "bfloat16") -> ModelInfo:
    """Where ``spec`` resolves and what its files say; problems are collected, never raised."""
    info = _inspect(spec, dtype)
    info.restricted_head &= not spec.full_head
    return info


def _inspect(spec: ModelSpec, dtype: str) -> ModelInfo:
    from .sources import locate, model_path

    info = ModelInfo(spec.name, "", dtype=spec.dtype or dtype)
    if spec.distill is not None:  # its teacher's problems are the teacher's (said once, under its name)
        return _draft(spec, teacher_spec(spec), info)
    try:
        kind, where = locate(spec)
    except ModelError as err:
        tried = list(dict.fromkeys(str(p) for p in _model_path_candidates(spec, model_path())))
        info.where = "not found"
        info.problems.append(
            f"config key models.{spec.name}: {err}" + (f" (looked in {', '.join(tried)})" if tried else "")
        )
        return info
    if kind in ("bundled", "gguf"):
        return _gguf(spec, kind, where, info)
    if kind == "hub":
        local = _hub_cache(where)
        info.where = f"hub cache {where}" if local else f"hub {where} (fetched by fetch_model; not checked)"
        return read_dir(info, local) if local else info
    root = model_path()
    info.where = f"MODEL_PATH/{where.relative_to(root)}" if root and where.parent == root else f"directory {where}"
    return read_dir(info, where)


def _model_path_candidates(spec: ModelSpec, root: Path | None) -> list[Path]:
    if root is None or (spec.source and spec.source.count("/") != 1):
        return []
    return [root / spec.name] + ([root / spec.source.split("/")[1]] if spec.source else [])


def _hub_cache(repo_id: str) -> Path | None:
    from huggingface_hub import snapshot_download

    with contextlib.suppress(Exception):
        return Path(snapshot_download(repo_id, local_files_only=True))
    return None


def _gguf(spec: ModelSpec, kind: str, where: Any, info: ModelInfo) -> ModelInfo:
    from .cache import cache_dir
    from .sources import bundled_gguf

    converted = cache_dir() / (BUNDLED if kind == "bundled" else spec.name)
    if (converted / "config.json").exists():
        info.where = f"{kind} (converted: {converted})"
        return read_dir(info, converted)
    gguf = bundled_gguf() if kind == "bundled" else where
    info.where = f"{kind} {gguf.name} (converted by prepare_model; not checked)"
    return info


def _draft(spec: ModelSpec, teacher: ModelSpec, info: ModelInfo) -> ModelInfo:
    from .cache import cache_dir
    from .distill import draft_name
    from .resolve import recipe_for
    from .student import student_name

    base = inspect(teacher, info.dtype)
    info.problems += base.problems
    student = "tokenizer" in spec.distill  # a tokenizer of its own, trained with the student
    try:
        recipe = recipe_for(spec.distill, spec.name)
    except ModelError as err:
        info.where = f"will be distilled from {teacher.name}"
        info.problems.append(f"config key models.{spec.name}.distill: {err}")
        return info
    out = None if base.problems else cache_dir() / "drafts" / (student_name if student else draft_name)(teacher, recipe)
    if out is not None and (out / "config.json").exists():
        info.where = f"distilled {'student' if student else 'draft'} {out}"
        return read_dir(info, out)
    info.where = f"will be distilled from {teacher.name}" + (" (a tokenizer of its own)" if student else "")
    if base.config is not None:
        info.config = {**base.config, "num_hidden_layers": recipe.layers}
        info.config.pop("layer_types", None)
        if student:
            info.config["vocab_size"] = recipe.vocab
    info.chat_template = base.chat_template  # a student keeps its teacher's chat template
    if student:
        return info  # its vocabulary is trained with it: read once it is distilled
    info.vocab = base.vocab
    info.restricted_head = bool(recipe.head_tokens) and not spec.full_head
    info.head_tokens = recipe.head_tokens or None
    return info


def inspect_config(config: dict[str, Any], names: list[str], dtype: str = "bfloat16") -> dict[str, ModelInfo]:
    """Every named model of a checked config."""
    return {n: inspect(ModelSpec(**config_entry(config["models"], n)), dtype) for n in names}
