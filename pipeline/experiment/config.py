"""A workflow config checked against the schema and then by name, defaults filled in (``config_file.py`` reads it).
Every problem is a ConfigError of one line naming the key, the value and what is accepted. ``grid.py`` expands a
checked config into cells; ``experiment/checks.py`` checks it against this machine.
"""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path
from typing import Any

import yaml

from .. import ROOT
from ..errors import ArgumentError, one_line
from ..records import schema_validator
from .config_file import ConfigError
from .preflight import own_tokenizer

SCHEMA = ROOT / "workflow" / "schemas" / "config.schema.yaml"


def load_schema(path: Path = SCHEMA) -> dict[str, Any]:
    return yaml.safe_load(Path(path).read_text())


def non_finite(value: Any, path: tuple = ()) -> tuple[tuple, float] | None:
    """The first NaN or infinite number anywhere in ``value`` (its path and value), or None."""
    if isinstance(value, float) and not math.isfinite(value):
        return path, value
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for k, v in items:
        found = non_finite(v, (*path, k))
        if found:
            return found
    return None


def _key(path) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(top level)"


BOUNDS = {"minimum": ">=", "exclusiveMinimum": ">", "maximum": "<="}


def _accepted(error, schema: dict[str, Any]) -> str:
    """What the schema accepts where ``error`` happened, in words."""
    sub = error.schema
    if "$ref" in sub:  # follow one local reference for its description
        node = schema
        for part in sub["$ref"].lstrip("#/").split("/"):
            node = node[part]
        sub = {**node, **{k: v for k, v in sub.items() if k != "$ref"}}
    v, vv = error.validator, error.validator_value
    if v == "enum":
        return "one of " + ", ".join("null" if x is None else str(x) for x in vv)
    if v == "type":
        return "a value of type " + (" or ".join(vv) if isinstance(vv, list) else vv)
    if v in BOUNDS:
        return f"a number {BOUNDS[v]} {vv}"
    if v in ("minItems", "minProperties"):
        return f"at least {vv} entr{'y' if vv == 1 else 'ies'}"
    if v == "maxLength":
        return f"at most {vv} characters"
    if v == "pattern":
        return "letters, digits and . _ + -, starting with a letter or digit"
    if v == "required":
        return "the keys " + ", ".join(vv)
    if v in ("oneOf", "anyOf"):
        texts = []
        for option in vv:
            if "enum" in option:
                texts += [str(x) for x in option["enum"]]
            elif option.get("type") == "integer":
                texts.append("a positive integer" if option.get("minimum") == 1 else "an integer")
            elif option.get("type") == "array":
                texts.append("a list of positive integers")
            else:
                texts.append(option.get("type", "?"))
        return ", ".join(texts[:-1]) + " or " + texts[-1] if len(texts) > 1 else texts[0]
    return sub.get("description") or error.message


def schema_errors(config: dict[str, Any], schema: dict[str, Any]) -> list[str]:
    """Every schema violation of ``config``, one line each (empty: valid)."""
    lines = []
    if bad := non_finite(config):
        lines.append(f"config key {_key(bad[0])}: {bad[1]} is not accepted; expected a finite number")
    for error in sorted(schema_validator(schema).iter_errors(config), key=lambda e: list(map(str, e.absolute_path))):
        where = _key(error.absolute_path)
        if error.validator == "additionalProperties":
            allowed = sorted(error.schema.get("properties", {}))
            extra = sorted(set(error.instance) - set(allowed))
            place = "" if where == "(top level)" else f" in {where}"
            path = list(error.absolute_path)
            if len(path) == 2 and path[0] == "models":  # a key renamed since: what it is called now
                from ..models.spec import renamed_key

                if renamed := renamed_key(path[1], extra):
                    lines.append(renamed)
                    continue
            lines.append(f"unknown config key {extra[0]!r}{place}; accepted: {', '.join(allowed)}")
        elif error.validator == "required":
            lines.append(f"config key {where}: {error.message}; it needs {_accepted(error, schema)}")
        else:
            value = json.dumps(error.instance, default=str)
            value = value[:57] + "..." if len(value) > 60 else value
            lines.append(f"config key {where}: {value} is not accepted; expected {_accepted(error, schema)}")
    return lines


def check_config(config: dict[str, Any], schema: dict[str, Any] | None = None) -> dict[str, Any]:
    """Validate ``config`` (schema, then names); return it with every default filled in. Raises ConfigError."""
    from tasks import TASKS

    from ..decoding.proposers import parse_proposer, tree_proposer_problem
    from ..decoding.spec import accepted_args, method_names, parse_method
    from ..engines import behaviour

    schema = schema or load_schema()
    if errors := schema_errors(config, schema):
        raise ConfigError(errors[0])
    config = fill_defaults(copy.deepcopy(config), schema)
    proposers = {"proposer": config["proposer"]}  # the registered proposer kinds (decoding/proposers/base.py)
    proposers |= {f"grids[{i}].proposer": g["proposer"] for i, g in enumerate(config["grids"]) if "proposer" in g}
    for key, value in proposers.items():
        try:
            parse_proposer(value)
        except ArgumentError as err:
            accepted = str(err).split("; ")[-1]
            raise ConfigError(f"config key {key}: {json.dumps(value)} is not accepted; {accepted}") from None
    for i, grid in enumerate(config["grids"]):  # a token tree needs proposers that give several candidates
        kind = parse_proposer(grid.get("proposer", config["proposer"]))
        trees = [t for t in grid.get("tree", config.get("tree") or [None]) if t is not None]
        if trees and (why := tree_proposer_problem(kind.named)):
            raise ConfigError(f"config key grids[{i}].tree: {json.dumps(trees[0])} with {why}")
    models = config["models"]
    methods_ok = method_names()
    for i, grid in enumerate(config["grids"]):
        where = f"config key grids[{i}]"
        for name, members in grid["model_sets"].items():
            for j, m in enumerate(members):
                text = f"{where}.model_sets.{name}[{j}]: model {m!r} is not defined under 'models'"
                _known(m, models, text, "defined")
        for j, method in enumerate(grid["methods"]):
            _known(method, methods_ok, f"{where}.methods[{j}]: {method!r} is not a method")
        for name in grid.get("datasets", config["datasets"]):
            _known(name, sorted(TASKS), f"{where}.datasets: {name!r} is not a dataset")
        usable = sorted(set().union(*(accepted_args(m) for m in grid["methods"])))
        for key in grid.get("method_args", {}):
            _known(key, usable, f"{where}.method_args.{key}: no method of grid {grid['name']!r} takes it")
    usable = sorted({k for g in config["grids"] for m in g["methods"] for k in accepted_args(m)})
    for key in config["method_args"]:  # the defaults of every grid: some method somewhere must take them
        _known(key, usable, f"config key method_args.{key}: no method of any grid takes it")
    for i, grid in enumerate(config["grids"]):  # a proposer that reads features drafts from the large model's head
        kind = parse_proposer(grid.get("proposer", config["proposer"]))
        readers = kind.feature_readers
        if readers:
            for name, members in grid["model_sets"].items():
                if models[members[0]].get("eagle") is None:
                    raise ConfigError(
                        f"config key grids[{i}].proposer: {readers[0]} drafts from a feature head of the set's large "
                        f"model, and models.{members[0]} (of set {name!r}) has none; give it eagle: {{}} (trained "
                        "here) or eagle: <a head's directory>"
                    )
        for method in grid["methods"]:  # vLLM's EAGLE drafts from a head of the large model that vLLM runs as ours
            if (spec := parse_method(method)).peer_reads_features:
                for name, members in grid["model_sets"].items():
                    entry = models[members[0]].get("eagle")
                    if why := behaviour(spec.engine).head_problem(spec.peer_speculator, members[0], entry):
                        raise ConfigError(f"config key grids[{i}].methods: {method} (set {name!r}): {why}")
    _check_heads(models)
    names = [g["name"] for g in config["grids"]]
    if len(set(names)) != len(names):
        dup = next(n for n in names if names.count(n) > 1)
        raise ConfigError(f"config key grids: the grid name {dup!r} is used twice; grid names must be unique")
    _check_teachers(models)
    _check_results_dir(config["results"])
    return config


def _known(value: Any, accepted, problem: str, label: str = "accepted") -> None:
    """Refuse ``value`` when it is not one of ``accepted``, listing them."""
    if value not in accepted:
        raise ConfigError(f"{problem}; {label}: {', '.join(accepted) or 'none'}")


PROJECT = Path(__file__).resolve().parents[2]  # the checkout: its own folders are never a results directory
SYSTEM_DIRS = tuple(Path(p) for p in ("/proc", "/sys", "/dev"))  # the kernel's files, never a results directory


def _check_results_dir(results: str) -> None:
    path = Path(results).expanduser().resolve()
    if not results.strip() or path == Path(path.anchor):
        raise ConfigError(
            f"config key results: {results!r} is a filesystem root; give a directory of its own (default: results)"
        )
    if path.exists() and not path.is_dir():
        raise ConfigError(f"config key results: {results!r} is a file, not a directory; give a directory of its own")
    if any(path.is_relative_to(system) for system in SYSTEM_DIRS):
        raise ConfigError(
            f"config key results: {results!r} is under the system's {path.parts[1]}/, not a place for files; give "
            "a directory of its own (default: results)"
        )
    inside = path.relative_to(PROJECT).parts if path.is_relative_to(PROJECT) else None
    if inside is not None and (not inside or (inside[0] != "results" and (PROJECT / inside[0]).exists())):
        where = f"the project's own {inside[0]}/" if inside else "the project's own directory"
        raise ConfigError(
            f"config key results: {results!r} is {where}, whose files the workflow would overwrite; give a directory "
            "of its own (default: results)"
        )


def _check_heads(models: dict[str, Any]) -> None:
    """Every model's ``eagle`` entry, as far as the config shows: a recipe's keys and values (``HeadRecipe``), or
    a head's directory and its own config (``head_files.head_dir_problem``); the target's side when it loads."""
    from pipeline.models import BUNDLED, ModelError
    from pipeline.models.feature_head import HeadRecipe
    from pipeline.models.head_files import head_dir_problem
    from pipeline.models.head_target import ensemble_target
    from pipeline.models.resolve import recipe_of

    for name, spec in models.items():
        eagle = spec.get("eagle")
        distill = spec.get("distill")
        restricted = isinstance(distill, dict) and not own_tokenizer(spec) and distill.get("head_tokens", 1) != 0
        if eagle is not None and restricted and not spec.get("full_head"):  # as models/files.py reads a draft
            raise ConfigError(
                f"config key models.{name}.eagle: {name!r} is a draft distilled with a restricted head, which a "
                "feature head cannot read (it drafts from its model's features over the whole vocabulary); give the "
                "head to a full model, or distill this one with full_head: true"
            )
        if isinstance(eagle, dict):
            try:
                recipe = recipe_of(HeadRecipe, eagle, f"eagle settings for {name!r}")
            except (ModelError, TypeError, ValueError) as err:  # a value of the wrong type: the recipe's own line
                raise ConfigError(f"config key models.{name}.eagle: {one_line(err)}") from None
            target = ensemble_target(recipe.target)
            for member in target.members if target is not None else ():
                if not isinstance(member, str) or (member != BUNDLED and member not in models):
                    raise ConfigError(
                        f"config key models.{name}.eagle.target.members: {member!r} is not a model of this config; "
                        f"accepted: {', '.join(dict.fromkeys([BUNDLED, *models]))}"
                    )
        elif isinstance(eagle, str) and (why := head_dir_problem(eagle)):
            raise ConfigError(f"config key models.{name}.eagle: {why}")


def _check_teachers(models: dict[str, Any]) -> None:
    """A distilled model's recipe is one ``pipeline distill`` takes; its teacher is the bundled model or
    another (not distilled) model of the config."""
    import dataclasses

    from pipeline.models import BUNDLED, ModelError, Recipe
    from pipeline.models.student import StudentRecipe, recipe_from

    for name, spec in models.items():
        distill = spec.get("distill")
        if distill is None:
            continue
        where = f"config key models.{name}.distill"
        fields = {f.name: f for f in dataclasses.fields(StudentRecipe if own_tokenizer(spec) else Recipe)}
        for key, value in distill.items():
            if key in ("teacher", "tokenizer"):
                continue
            if key not in fields:
                raise ConfigError(f"{where}: unknown key {key!r}; accepted: teacher, tokenizer, {', '.join(fields)}")
            want_int = isinstance(fields[key].default, int)
            ok = not isinstance(value, bool) and isinstance(value, int if want_int else int | float)
            zero_ok = key in ("head_tokens", "seed", "warmup")
            if not ok or value < 0 or (value == 0 and not zero_ok):
                kind = "an integer" if want_int else "a number"
                floor = ">= 0" if zero_ok else "> 0"
                raise ConfigError(f"{where}.{key}: {value!r} is not accepted; expected {kind} {floor}")
        if own_tokenizer(spec):  # a student with a tokenizer of its own: its tokenizer's settings
            try:
                recipe_from(distill, name)
            except ModelError as err:
                raise ConfigError(f"{where}: {err}") from None
        teacher = distill.get("teacher", BUNDLED)
        if not isinstance(teacher, str) or (teacher != BUNDLED and teacher not in models):
            raise ConfigError(
                f"{where}.teacher: {teacher!r} is not a model of this config; "
                f"accepted: {', '.join(dict.fromkeys([BUNDLED, *models]))}"
            )
        if teacher in models and models[teacher].get("distill") is not None:
            raise ConfigError(f"{where}.teacher: {teacher!r} is itself distilled; a teacher must be a full model")


def model_entry(config: dict[str, Any], name: str) -> dict[str, Any]:
    """A model of the config as ``pipeline prepare`` / ``generate`` take it (a teacher of the config
    with its own source)."""
    from pipeline.models.spec import config_entry

    return config_entry(config["models"], name)


def fill_defaults(config: dict[str, Any], schema: dict[str, Any], depth: int = 2) -> dict[str, Any]:
    """Fill defaults from the schema, top level and one below (as Snakemake's ``validate(set_default=True)``)."""
    for key, sub in schema["properties"].items():
        if key not in config and "default" in sub:
            config[key] = copy.deepcopy(sub["default"])
        if depth > 1 and isinstance(config.get(key), dict) and "properties" in sub:
            fill_defaults(config[key], sub, depth - 1)
    return config
