"""The records the project reads back, one schema each, and the one way to read them: ``read_record``.

Every record type a job, a cache, a user or another process hands the project (``RECORDS``) has one JSON Schema
here, derived from its type where it has one (``SpeedSummary``, ``Dims``: a field's annotation is its schema).
``read_record`` reads the file through the I/O layer (``files.read_user_json``: no link followed into a pipe, no
file over its limit read, not UTF-8, not JSON or past JSON's bounds one line; a result's file never through a link:
``LINKED`` names the records that may be links) and checks it against its schema where it enters, so a
record of the right format and the wrong content is one line naming the file, the field and what is accepted,
never a traceback minutes later. ``tests/test_records.py`` runs Hypothesis over every schema.
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from pathlib import Path
from typing import Any

from .errors import UserError
from .files import MAX_USER_FILE, read_user_json

__all__ = [
    "ID",
    "RecordError",
    "read_record",
    "record_problems",
    "records",
    "register",
    "schema_of",
    "schema_problems",
    "schema_validator",
    "shown_key",
]


class RecordError(UserError):
    """A record that is not what its type says (one line: the file, the field, what is accepted)."""


# ---- a schema's checks: one line per part of a value it does not accept -------------------------------------------


def schema_validator(schema: dict[str, Any]):
    """A JSON Schema's validator for what a user gives, with "integer" meaning a real int (JSON Schema alone
    accepts 4.0 and True): the config's schema and a model's config.json (``records.CONFIG_JSON``)."""
    import jsonschema

    cls = jsonschema.validators.validator_for(schema)
    checker = cls.TYPE_CHECKER.redefine("integer", lambda _, x: isinstance(x, int) and not isinstance(x, bool))
    return jsonschema.validators.extend(cls, type_checker=checker)(schema)


def shown_key(part: Any) -> str:
    """A key of a path into a record as one line shows it: as it is, or escaped (JSON's escapes, quoted) where it
    holds a character that is not printable, such as a newline."""
    text = str(part)
    return text if text.isprintable() else json.dumps(text)


def schema_problems(schema: dict[str, Any], value: Any, where: str) -> list[str]:
    """One line per part of ``value`` that ``schema`` does not accept, naming ``where`` (a file, a line), the key,
    the value (shortened) and what is accepted (a subschema's ``accepted`` where it says it in words)."""
    lines = []
    for error in sorted(schema_validator(schema).iter_errors(value), key=lambda e: list(map(str, e.absolute_path))):
        key = ".".join(map(shown_key, error.absolute_path)) or "(top level)"
        shown = json.dumps(error.instance, default=str)
        shown = shown if len(shown) <= 40 else shown[:37] + "..."
        if error.validator == "required":
            lines.append(f"{where}: {error.message}")
        else:
            said = error.schema.get("accepted") if isinstance(error.schema, dict) else None  # the schema's words
            lines.append(f"{where}: {key}={shown} is not accepted ({said or error.message.split(' is ')[-1][:80]})")
    return lines


# ---- the records -------------------------------------------------------------------------------------------------

NAME = {"type": "string", "minLength": 1}
# a cell's id: a relative path under the results directory, no '.' or '..' part (its files are named by it)
ID = {
    "type": "string",
    "pattern": r"^[^/\\][^\\]*$",
    "not": {"pattern": r"(^|/)\.\.?(/|$)|//|/$"},
    "accepted": "a path relative to the results directory, with no '.' or '..' part",
}
NUMBER_OR_NULL = {"type": ["number", "null"]}
TOKEN_ID = {"type": "integer", "minimum": 0, "accepted": "a token id, an integer >= 0"}
COUNT = {"type": "integer", "minimum": 0, "accepted": "a count, an integer >= 0"}
SECONDS = {"type": "number", "minimum": 0, "accepted": "seconds, a number >= 0"}  # JSON has no NaN or infinity

POSITIVE = {"type": "integer", "minimum": 1}


def whole(maximum: int) -> dict[str, Any]:
    """A config.json size: a real integer (not true, 2.0, "2" or NaN) from 1 to ``maximum``."""
    return {**POSITIVE, "maximum": maximum, "accepted": f"a whole number from 1 to {maximum:,}"}


def whole_or_null(maximum: int) -> dict[str, Any]:
    return {"anyOf": [whole(maximum), {"type": "null"}], "accepted": f"a whole number from 1 to {maximum:,}, or null"}


# the activations of transformers' ACT2FN a model of this project may name (its decoders: Llama's, Qwen's, Gemma's)
ACTIVATIONS = ("silu", "swish", "gelu", "gelu_new", "gelu_fast", "gelu_accurate", "gelu_pytorch_tanh", "quick_gelu")
ACTIVATIONS += ("relu", "relu2", "tanh", "sigmoid")
TORCH_DTYPES = ("float32", "float16", "bfloat16", "float64", "float", "half", "double", "auto")  # torch's names
DTYPE_NAME = {
    "anyOf": [{"enum": list(TORCH_DTYPES)}, {"type": "null"}],
    "accepted": f"one of {', '.join(TORCH_DTYPES)}",
}
POSITIVE_NUMBER = {"type": "number", "exclusiveMinimum": 0, "accepted": "a finite number > 0"}
CONFIG_JSON = {  # what the preflight reads of a model's config.json, checked before anything is built from it
    "type": "object",
    "required": ["model_type", "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads"],
    "properties": {
        "model_type": {"type": "string", "minLength": 1},
        "vocab_size": whole(10_000_000),
        "hidden_size": whole(1_000_000),
        "num_hidden_layers": whole(1_000),
        "num_attention_heads": whole(10_000),
        "num_key_value_heads": whole_or_null(10_000),
        "intermediate_size": whole_or_null(10_000_000),
        "head_dim": whole_or_null(100_000),
        "max_position_embeddings": whole_or_null(100_000_000),
        "tie_word_embeddings": {"type": "boolean"},
        "hidden_act": {"enum": list(ACTIVATIONS), "accepted": f"one of {', '.join(ACTIVATIONS)}"},
        "torch_dtype": DTYPE_NAME,
        "dtype": DTYPE_NAME,  # transformers 5's name for it
        "rope_theta": {"anyOf": [POSITIVE_NUMBER, {"type": "null"}], "accepted": "a finite number > 0, or null"},
        "rms_norm_eps": {**POSITIVE_NUMBER, "maximum": 1, "accepted": "a number > 0 and at most 1"},
        "rope_scaling": {
            "anyOf": [{"type": "null"}, {"type": "object", "properties": {"factor": POSITIVE_NUMBER}}],
            "accepted": "null or an object whose factor is a number > 0",
        },
    },
}

SIMPLE = {int: {"type": "integer"}, float: {"type": "number"}, str: {"type": "string"}, bool: {"type": "boolean"}}


def annotation_schema(kind: Any) -> dict[str, Any]:
    """The JSON Schema of a field's type annotation (int, float, str, bool, list, dict, Any, ``X | None``)."""
    if kind in SIMPLE:
        return dict(SIMPLE[kind])
    if kind is Any:
        return {}
    origin = typing.get_origin(kind)
    if origin in (types.UnionType, typing.Union):
        return {"anyOf": [annotation_schema(k) if k is not type(None) else {"type": "null"} for k in kind.__args__]}
    if kind is list or origin is list:
        args = typing.get_args(kind)
        return {"type": "array", **({"items": annotation_schema(args[0])} if args else {})}
    if kind is dict or origin is dict:
        return {"type": "object"}
    raise TypeError(f"no JSON Schema for the annotation {kind!r}")


def schema_of(cls: type, closed: bool = True) -> dict[str, Any]:
    """The JSON Schema of a dataclass's JSON form: each field by its annotation (null also accepted where its
    default is None), the fields without a default required, other keys refused where ``closed``."""
    hints = typing.get_type_hints(cls)
    props, required = {}, []
    for f in dataclasses.fields(cls):
        schema = annotation_schema(hints[f.name])
        if f.default is None and schema.get("type") != "null":
            schema = {"anyOf": [schema, {"type": "null"}]}
        props[f.name] = schema
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            required.append(f.name)
    return {"type": "object", "properties": props, "required": required, "additionalProperties": not closed}


def register(kind: str, schema: dict[str, Any]) -> None:
    """Record type ``kind``'s schema, from the module of the type it is the JSON form of (``measure/speed.py``:
    the speed record; ``experiment/cell.py``: grid.json and the cell file), which its readers import."""
    RECORDS[kind] = schema


def records() -> dict[str, dict[str, Any]]:
    """Every record type's schema, by the name its messages give it."""
    return RECORDS


RECORDS: dict[str, dict[str, Any]] = {
    # a generation job's meta file (<cell>.meta.json): what ran and where
    "meta": {
        "type": "object",
        "required": ["cell", "environment"],
        "properties": {"cell": {"type": "object"}, "environment": {"type": "object"}, "corpus": {}},
    },
    # one line of a samples file: what the scorer and the tables read of it
    "sample": {
        "type": "object",
        "required": ["id", "output"],
        "properties": {
            "id": NAME,
            "output": {"type": "string"},
            "token_ids": {"type": "array", "items": TOKEN_ID},
            "prompt_ids": {"type": "array", "items": TOKEN_ID},
            "stats": {"type": "object"},
        },
    },
    # a cell's score summary (<cell>.summary.json): metric -> value
    "score summary": {"type": "object", "additionalProperties": {"type": ["number", "string", "boolean", "null"]}},
    # a distilled draft's record (draft.json in its directory)
    "draft.json": {
        "type": "object",
        "properties": {
            "teacher": NAME,
            "recipe": {"type": "object"},
            **{k: NUMBER_OR_NULL for k in ("steps", "train_seconds", "final_loss", "total_seconds")},
            **{k: NUMBER_OR_NULL for k in ("agreement", "agreement_with_lookup", "acceptance_t1")},
            "acceptance_t1_with_lookup": NUMBER_OR_NULL,
            "versions": {"type": "object", "additionalProperties": {"type": "string"}},
        },
    },
    # what the preparation of a model for the grid recorded (results/models/<name>.json)
    "model record": {
        "type": "object",
        "properties": {"distilled": {"type": ["object", "null"]}, "feature_head": {"type": ["object", "null"]}},
    },
    # the likelihood job's scores (results/likelihood/<set>.json)
    "likelihood record": {
        "type": "object",
        "required": ["scores"],
        "properties": {
            "scores": {
                "type": "object",
                "additionalProperties": {
                    "type": "object",
                    "properties": {"uses": {"type": "array", "items": {"type": "string"}}},
                },
            }
        },
    },
    # vLLM's environment marker (env.json): what was built, with which interpreter
    "env.json": {
        "type": "object",
        "required": ["build", "python"],
        "properties": {"build": NAME, "python": NAME, "vllm": {"type": "string"}, "lock": {"type": "string"}},
    },
    # a model directory's files the preflight and the loaders read
    "config.json": CONFIG_JSON,
    "tokenizer_config.json": {
        "type": "object",
        "properties": {
            "chat_template": {
                "accepted": "a Jinja template as a string, null, or a list of {name, template} strings",
                "anyOf": [
                    {"type": "string"},
                    {"type": "null"},
                    {
                        "type": "array",
                        "items": {
                            "type": "object",
                            "required": ["name", "template"],
                            "properties": {"name": {"type": "string"}, "template": {"type": "string"}},
                        },
                    },
                ],
            },
            "model_max_length": {"type": "number"},
        },
    },
    "head_tokens.json": {"type": "array", "items": TOKEN_ID},
    # vLLM's worker (``vllm/worker.py``), one JSON line each: ready (its versions, its load time), then one answer
    # per generation (ids, wall time, vLLM's speculation counters)
    "vLLM worker start": {
        "type": "object",
        "required": ["versions", "load_s"],
        "properties": {"versions": {"type": "object", "additionalProperties": {"type": "string"}}, "load_s": SECONDS},
    },
    "vLLM worker answer": {
        "type": "object",
        "required": ["token_ids", "wall_s", "drafts", "draft_tokens", "accepted", "accepted_per_pos"],
        "properties": {
            "token_ids": {"type": "array", "items": TOKEN_ID},
            "wall_s": SECONDS,
            **{k: COUNT for k in ("drafts", "draft_tokens", "accepted")},
            "accepted_per_pos": {"type": "array", "items": COUNT},
        },
    },
}  # and, registered by their types' modules: "speed record", "grid.json", "cell file"


# the records read from a model's files or an environment, where a link is followed (a Hugging Face cache is made of
# them); every other record is a result of the project's, read as itself: a link in its place is one line
LINKED = frozenset({"config.json", "tokenizer_config.json", "head_tokens.json", "draft.json", "env.json"})


def record_problems(kind: str, value: Any, where: str) -> list[str]:
    """One line per part of ``value`` that record type ``kind``'s schema does not accept, naming ``where``."""
    return schema_problems(records()[kind], value, where)


def read_record(path: Path | str, kind: str, what: str | None = None, limit: int = MAX_USER_FILE) -> Any:
    """Record ``path`` of type ``kind`` (``records()``), read through the I/O layer and checked against its schema;
    a ``RecordError`` (one line: ``what`` it is, the file, the first field refused and what is accepted) when it
    is missing, not a plain file, over ``limit`` bytes, not JSON or not of its type; a link, unless ``LINKED``."""
    if kind not in RECORDS:  # a type registered by its module: the reader imports that module
        raise KeyError(f"record type {kind!r} is not registered; import the module of its type first")
    path, what = Path(path), what or kind
    value = read_user_json(path, what, limit, links=kind in LINKED)
    if problems := record_problems(kind, value, f"{what} {path}"):
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise RecordError(problems[0] + more)
    return value
