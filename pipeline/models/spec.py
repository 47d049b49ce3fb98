"""Models as the config names them: a name, a source, a dtype and a device, or a draft distilled from a teacher."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

import torch

from .. import ROOT
from ..errors import UserError

BUNDLED = "smollm2-135m-instruct"
DEFAULT_CONFIG = ROOT / "config" / "default.yaml"  # names the default drafts
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16, "float64": torch.float64}


class ModelError(UserError):
    """A model could not be resolved or loaded (a user-facing, one-line error)."""


@dataclass
class ModelSpec:
    """A model as the config names it."""

    name: str
    source: str | None = None  # directory, GGUF file, hub id, 'bundled'; None: bundled name or MODEL_PATH/name
    dtype: str | None = None  # default: float32 on CPU, bfloat16 on GPU
    device: str | None = None  # cpu, cuda, cuda:N or auto (spread over the GPUs); default: cuda when present, else cpu
    distill: dict[str, Any] | None = None  # {teacher: <model name>, layers, head_tokens, steps, seed}
    full_head: bool = False  # a distilled draft with its teacher's full output head (e.g. a CD amateur)
    pack: bool | None = None  # oneDNN-prepacked linear layers (default: on for float32 on the CPU, eager runner)
    runner: str = "eager"  # eager (a dynamic cache), compiled (a static cache, compiled forwards), compiled+autotune
    eagle: str | dict[str, Any] | None = None  # a feature head: a directory, or a recipe trained here ({} = defaults)

    def __post_init__(self):
        for key, kinds in SPEC_TYPES.items():
            value = getattr(self, key)
            if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
                accepted = " or ".join(
                    "null" if k is type(None) else {dict: "a mapping"}.get(k, k.__name__) for k in kinds
                )
                shown = repr(value)
                shown = shown if len(shown) <= 60 else shown[:57] + "..."
                raise ModelError(f"model {str(self.name)[:60]!r}: {key}={shown} is not accepted; expected {accepted}")

    def resolved_device(self) -> str:
        device = self.device or ("cuda" if torch.cuda.is_available() else "cpu")
        kind, _, index = device.partition(":")
        if device != "auto" and (kind not in ("cpu", "cuda") or (index and not index.isdigit())):
            raise ModelError(f"device={device!r} for model {self.name!r}: expected cpu, cuda, cuda:N or auto")
        if device not in ("cpu", "auto") and not torch.cuda.is_available():  # auto: accelerate's map, cpu here
            raise ModelError(f"device={device!r} for model {self.name!r}: this machine has no CUDA device; use cpu")
        if index and int(index) >= torch.cuda.device_count():
            count = torch.cuda.device_count()
            raise ModelError(f"device={device!r} for model {self.name!r}: this machine has cuda:0..cuda:{count - 1}")
        return device

    def resolved_dtype(self) -> torch.dtype:
        if self.dtype is None:
            return torch.float32 if self.resolved_device() == "cpu" else torch.bfloat16
        if self.dtype not in DTYPES:
            raise ModelError(f"dtype={self.dtype!r} for model {self.name!r}: expected one of {', '.join(DTYPES)}")
        return DTYPES[self.dtype]


SPEC_TYPES = {  # what each field of a spec may hold
    "name": (str,),
    "source": (str, type(None)),
    "dtype": (str, type(None)),
    "device": (str, type(None)),
    "distill": (dict, type(None)),
    "full_head": (bool,),
    "pack": (bool, type(None)),
    "runner": (str,),
    "eagle": (str, dict, type(None)),
}


def teacher_spec(spec: ModelSpec) -> ModelSpec:
    """The teacher of a distilled model: a name (resolved like any model) or a full spec."""
    return spec_of((spec.distill or {}).get("teacher", BUNDLED), f"teacher of {spec.name!r}")


def spec_of(value: str | dict[str, Any], what: str) -> ModelSpec:
    """A model another names (a teacher, an ensemble's member): a name, resolved like any model, or a full spec
    dict (``config_entry``); one line, saying ``what`` it is, where the dict is not a spec."""
    if isinstance(value, dict):
        try:
            return ModelSpec(**value)
        except TypeError as err:
            raise ModelError(f"{what}: {err}") from None
    return ModelSpec(value)


RENAMED = {"engine": ("runner", "eager, compiled or compiled+autotune")}  # model keys renamed: old -> new, values


def renamed_key(name: Any, keys) -> str | None:
    """The one line for a model entry (``keys``) that still uses a key since renamed, or None."""
    old = next((k for k in RENAMED if k in keys), None)
    if old is None:
        return None
    new, values = RENAMED[old]
    return f"model {str(name)[:60]!r}: key {old!r} is now {new!r} ({values})"


def stored_spec(entry: dict[str, Any]) -> dict[str, Any]:
    """A model spec dict as a record written before a key was renamed holds it, under the key's new name (a cell
    file of an earlier run stays readable; a config, a user's words, is told the new name instead)."""
    old = {k: new for k, (new, _) in RENAMED.items() if k in entry and new not in entry}
    return {old.get(k, k): v for k, v in entry.items()}


def check_renamed(entry: dict[str, Any]) -> dict[str, Any]:
    """``entry``, a model spec dict; refused in one line where it still uses a renamed key."""
    if line := renamed_key(entry.get("name"), entry):
        raise ModelError(line)
    return entry


MODEL_KEYS = tuple(f.name for f in fields(ModelSpec) if f.name != "name")  # what a config's model entry may set


def config_entry(models: dict[str, Any], name: str, head: bool = True) -> dict[str, Any]:
    """A model of a config's ``models`` section as a spec dict; a teacher of the same section, and a member of the
    ensemble its feature head is trained for, are given with their own sources (``head``: with its ``eagle``
    entry; a teacher's and a member's are left out: their logits are their model's)."""
    keys = [k for k in MODEL_KEYS if head or k != "eagle"]
    entry = {"name": name, **{k: v for k, v in models[name].items() if k in keys}}
    teacher = (entry.get("distill") or {}).get("teacher")
    if teacher in models:
        entry["distill"] = {**entry["distill"], "teacher": config_entry(models, teacher, head=False)}
    eagle = entry.get("eagle")
    if isinstance(eagle, dict) and isinstance(eagle.get("target"), dict):
        members = eagle["target"].get("members")
        if isinstance(members, list):
            members = [
                config_entry(models, m, head=False) if isinstance(m, str) and m in models else m for m in members
            ]
            entry["eagle"] = {**eagle, "target": {**eagle["target"], "members": members}}
    return entry


def default_models() -> dict[str, ModelSpec]:
    """The models of the embedded default config, by the names that config gives them."""
    return {name: ModelSpec(**entry) for name, entry in default_entries().items()}


def default_entries(head: bool = True) -> dict[str, dict[str, Any]]:
    """The models of the embedded default config as spec dicts (``config_entry``; ``head``: with their ``eagle``)."""
    import yaml

    try:
        models = yaml.safe_load(DEFAULT_CONFIG.read_text())["models"]
    except (OSError, KeyError, TypeError) as err:
        raise ModelError(f"the default models are read from {DEFAULT_CONFIG}: {err}") from None
    return {name: config_entry(models, name, head) for name in models}


def parse_model(text: str) -> ModelSpec:
    """``NAME[=SOURCE]``: a model of the default config by its name, or any model with a source."""
    name, _, source = text.partition("=")
    if not source and name in (defaults := default_models()):
        return defaults[name]
    return ModelSpec(name, source or None)
