"""A local model directory loaded for inference: restricted heads, prepacked CPU kernels, one shared tokenizer."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import torch

from ..errors import UserError, one_line
from .cache import META
from .config_json import read_config_json
from .sources import bundled_dir
from .spec import ModelError


def load(
    path: str | Path,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    full_head: bool = False,
    pack: bool | None = None,
    runner: str = "eager",
):
    """Load a local model directory and its tokenizer for inference.

    ``device`` is a torch device or ``auto`` (layers spread over the GPUs by
    accelerate's ``device_map="auto"``, for a model larger than one GPU);
    ``full_head`` ignores a distilled draft's restricted head; ``pack`` swaps
    the linear layers for oneDNN-prepacked ones (``cpu_kernels.py``; default:
    on for float32 on the CPU with the eager runner, where it makes a forward
    of 1-4 tokens cost about the same); ``runner`` picks the decoder's runner
    (``eager`` or ``compiled``, ``pipeline/decoding/static.py``).
    """
    from transformers import AutoModelForCausalLM

    from ..decoding.runner import set_runner

    path = Path(path)
    if (path / "config.json").exists():  # its values typed before anything is built (none: load_tokenizer says)
        read_config_json(path / "config.json", "model config")
    tokenizer = load_tokenizer(path)  # first: it costs less than the weights
    from safetensors import SafetensorError
    from transformers.utils import logging as hf_logging

    verbosity, bars = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()  # its multi-line load report: said below in one line instead
    hf_logging.disable_progress_bar()  # a log holds what went wrong, not a bar per load
    try:
        placement = {"device_map": "auto"} if device == "auto" else {}
        model, info = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, output_loading_info=True, **placement)
        model = (model if device == "auto" else model.to(device)).eval()
    except RuntimeError:  # tensors of other shapes than config.json gives (transformers' report is silenced)
        raise ModelError(
            f"model directory {path} could not be loaded: its weight files hold tensors of other shapes than "
            "its config.json describes (files of another model?)"
        ) from None
    except (OSError, ValueError, KeyError, SafetensorError) as err:  # damaged or partial files
        raise ModelError(f"model directory {path} could not be loaded: {one_line(err)}") from None
    finally:
        hf_logging.set_verbosity(verbosity)
        if bars:
            hf_logging.enable_progress_bar()
    if missing := info.get("missing_keys"):  # they would be random: a silently wrong model
        raise ModelError(
            f"model directory {path} could not be loaded: {len(missing)} weights are missing from its files "
            f"(first: {sorted(missing)[0]}); the files are incomplete or of another model"
        )
    if (path / META).exists():  # a draft this project trained: its weights are checked as they load
        check_finite(model, path)
    head_file = path / "head_tokens.json"
    if head_file.exists() and not full_head:  # a distilled draft whose head scores a subset of the vocabulary
        from .restricted import RestrictedHeadLM

        model = RestrictedHeadLM(model, head_tokens(head_file, model)).eval()
    if pack is None:
        pack = dtype == torch.float32 and device != "auto" and torch.device(device).type == "cpu" and runner == "eager"
    if pack:
        from .cpu_kernels import pack_linears

        pack_linears(model)
    return set_runner(model, runner), tokenizer


def load_tokenizer(path: str | Path):
    """A local model directory's tokenizer (a ModelError, one line, where it is missing or damaged)."""
    from transformers import AutoTokenizer

    path = Path(path)
    if not (path / "config.json").exists():
        raise ModelError(f"model directory {path} not found (or has no config.json)")
    try:
        return AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError, KeyError, TypeError) as err:
        said = " ".join(str(err).split())  # every line of the message, joined: none cut mid-sentence
        said = said if len(said) <= 240 else said[:240].rsplit(" ", 1)[0] + " ..."
        raise ModelError(
            f"model directory {path} has no usable tokenizer (tokenizer.json or tokenizer_config.json missing "
            f"or damaged): {type(err).__name__}: {said}"
        ) from None


def check_finite(model: torch.nn.Module, path: Path) -> None:
    """Refuse, in one line naming the first tensor, a model whose weights hold NaN or infinity (a draft trained to
    NaN proposes nothing, silently: the run stays exact and slow)."""
    for name, tensor in model.state_dict().items():
        if tensor.is_floating_point() and not torch.isfinite(tensor).all():
            raise ModelError(f"model directory {path}: its weight {name} holds NaN or infinity; distil it again")


def head_tokens(head_file: Path, model: torch.nn.Module) -> list[int]:
    """A restricted head's kept ids (``head_tokens.json``): distinct ids below the model's vocabulary rows."""
    from ..records import read_record

    try:
        kept = read_record(head_file, "head_tokens.json", "restricted head")
    except UserError as err:
        raise ModelError(str(err)) from None
    rows = model.get_output_embeddings().weight.shape[0]
    if not kept or len(set(kept)) != len(kept) or max(kept) >= rows:
        raise ModelError(
            f"restricted head {head_file}: expected distinct token ids below {rows} (the model's vocabulary), "
            f"got {len(kept)} ids, {len(set(kept))} distinct, the largest {max(kept, default=None)}"
        )
    return kept


def load_bundled(dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu", pack: bool | None = None):
    return load(bundled_dir(), dtype, device, pack=pack)


def check_tokenizers(names: list[str], tokenizers: list[Any]) -> None:
    """Refuse a model set whose tokenizers differ, naming both vocabularies."""
    if (other := first_different(tokenizers)) is not None:
        first, vocab = tokenizers[0].get_vocab(), tokenizers[other].get_vocab()
        raise ModelError(
            f"models {names[0]!r} (vocabulary of {len(first)}) and {names[other]!r} (vocabulary of {len(vocab)}) "
            "have different tokenizers; an ensemble needs one shared vocabulary"
        )


def first_different(tokenizers: list[Any]) -> int | None:
    """The index of the first tokenizer whose vocabulary differs from the first's (None: one shared tokenizer)."""
    first = tokenizers[0].get_vocab()
    return next((i for i, tok in enumerate(tokenizers[1:], 1) if tok.get_vocab() != first), None)


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
