"""The workflow's grid: check a config and expand it into cells.

The Snakefile calls :func:`check_config` (one-line errors naming the key, the
value and what is accepted) and :func:`expand_cells`. A cell is one model set,
one method, one dataset, one temperature and one gamma; its JSON form is what
``pipeline generate`` runs. Cells that do not apply are left out: no gamma
sweep for methods that do not speculate, ``sd`` and CD only for pairs, an
ensemble only for sets of two models or more. ``large_model`` runs the set's
first model alone and is shared by every set that starts with it.
"""

from __future__ import annotations

import copy
import itertools
import json
import math
import sys
from pathlib import Path
from typing import Any

import yaml

from .errors import UserError
from .files import read_user_text
from .preflight import (
    mixed_tokenizers,
    models_to_prepare,  # noqa: F401  (the Snakefile's and tests' name for it)
    one_tokenizer_only,
    own_tokenizer,
)

SCHEMA = Path(__file__).resolve().parent.parent / "workflow" / "schemas" / "config.schema.yaml"
GRID_KEYS = "datasets gamma gamma_schedule temperature max_new_tokens method_args proposer se_large_gamma tree".split()


class ConfigError(UserError):
    """A bad config value: one line naming the key, the value and what is accepted."""


# ---- reading ------------------------------------------------------------------------------


class _StrictLoader(yaml.SafeLoader):
    """YAML that refuses a key given twice in one mapping (plain YAML keeps the last one silently)."""

    def construct_mapping(self, node, deep=False):
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            where = f"line {key_node.start_mark.line + 1} of {key_node.start_mark.name}"
            try:
                hash(key)
            except TypeError:
                raise ConfigError(f"config key {key!r} ({where}) is not a plain value; keys are names") from None
            if key in seen:
                raise ConfigError(f"config key {key!r} is given twice ({where}); each key may appear once in a mapping")
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def load_config_file(path: Path) -> dict[str, Any]:
    """A YAML or JSON config file, duplicate keys refused; ConfigError names what is wrong."""
    path = Path(path)
    try:
        data = yaml.load(read_user_text(path, "config file"), Loader=_StrictLoader)  # noqa: S506 (a SafeLoader)
    except UserError as err:
        raise ConfigError(str(err)) from None
    except yaml.YAMLError as err:
        raise ConfigError(f"config file {path} is not valid YAML: {str(err).splitlines()[0]}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path}: expected a mapping of keys to values, got a {type(data).__name__}")
    return data


# ---- schema ---------------------------------------------------------------------------------


def load_schema(path: Path = SCHEMA) -> dict[str, Any]:
    return yaml.safe_load(Path(path).read_text())


def _validator(schema: dict[str, Any]):
    """The schema's validator, with "integer" meaning a real int (JSON Schema alone accepts 4.0 and True)."""
    import jsonschema

    cls = jsonschema.validators.validator_for(schema)
    checker = cls.TYPE_CHECKER.redefine("integer", lambda _, x: isinstance(x, int) and not isinstance(x, bool))
    return jsonschema.validators.extend(cls, type_checker=checker)(schema)


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
    for error in sorted(_validator(schema).iter_errors(config), key=lambda e: list(map(str, e.absolute_path))):
        where = _key(error.absolute_path)
        if error.validator == "additionalProperties":
            allowed = sorted(error.schema.get("properties", {}))
            extra = sorted(set(error.instance) - set(allowed))
            place = "" if where == "(top level)" else f" in {where}"
            lines.append(f"unknown config key {extra[0]!r}{place}; accepted: {', '.join(allowed)}")
        elif error.validator == "required":
            lines.append(f"config key {where}: {error.message}; it needs {_accepted(error, schema)}")
        else:
            value = json.dumps(error.instance, default=str)
            value = value[:57] + "..." if len(value) > 60 else value
            lines.append(f"config key {where}: {value} is not accepted; expected {_accepted(error, schema)}")
    return lines


# ---- the grid ----------------------------------------------------------------------------


def _spec(method: str):
    from pipeline.decoding.spec import parse_method

    return parse_method(method)


def _accepted_args(method: str) -> set[str]:
    return set(_spec(method).accepted_args())


def _fmt_gamma(g: Any, schedule: str = "fixed", tree: Any = None) -> str:
    """A gamma as cell ids and tables show it; a dynamic schedule's starting gamma is marked ``dyn``; in the
    tables a token tree follows it with its node budget (``3 t3x2x1 (15 nodes)``)."""
    text = "-".join(map(str, g)) if isinstance(g, list) else str(g)
    text = text + "dyn" if schedule == "dynamic" else text
    return f"{text} {tree.label} ({tree.nodes} nodes)" if tree is not None else text


def check_config(config: dict[str, Any], schema: dict[str, Any] | None = None) -> dict[str, Any]:
    """Validate ``config`` (schema, then names); return it with every default filled in. Raises ConfigError."""
    from pipeline.decoding.methods import method_names
    from tasks import TASKS

    schema = schema or load_schema()
    if errors := schema_errors(config, schema):
        raise ConfigError(errors[0])
    config = fill_defaults(copy.deepcopy(config), schema)
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
        usable = sorted(set().union(*(_accepted_args(m) for m in grid["methods"])))
        for key in grid.get("method_args", {}):
            _known(key, usable, f"{where}.method_args.{key}: no method of grid {grid['name']!r} takes it")
    usable = sorted({k for g in config["grids"] for m in g["methods"] for k in _accepted_args(m)})
    for key in config["method_args"]:  # the defaults of every grid: some method somewhere must take them
        _known(key, usable, f"config key method_args.{key}: no method of any grid takes it")
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


def _check_results_dir(results: str) -> None:
    path = Path(results).expanduser().resolve()
    if not results.strip() or path == Path(path.anchor):
        raise ConfigError(
            f"config key results: {results!r} is a filesystem root; give a directory of its own (default: results)"
        )


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


def check_local(config: dict[str, Any], cells: dict[str, dict[str, Any]]) -> None:
    """What can be checked on this machine before any job starts, every problem at once (one line each)."""
    problems = local_problems(config, cells)[1]
    if len(problems) > 1:
        raise ConfigError(f"{len(problems)} problems before any job:\n" + "\n".join(f"  {p}" for p in problems))
    if problems:
        raise ConfigError(problems[0])


def local_problems(config: dict[str, Any], cells: dict[str, dict[str, Any]], gpu: str | None = None):
    """The models' preflight infos and every problem of data, model files, model sets and dataset sizes.

    Hub sources are checked only when the hub is offline (then they must be in the local hub cache).
    """
    from tasks import HubSkipped, TaskError, get_task

    from . import preflight
    from .context_check import check_context

    problems = []
    data_dir = config["data_dir"]
    if data_dir is not None and not Path(data_dir).expanduser().is_dir():
        problems.append(f"config key data_dir: directory {data_dir!r} not found")
        data_dir = None
    infos, found = preflight.run(config, cells, gpu)
    datasets = {(c["cell"]["task"], json.dumps(c["cell"]["size"])): c["cell"] for c in cells.values()}
    for cell in datasets.values():  # each dataset and size once (the seed is the config's)
        try:
            get_task(cell["task"]).load(cell["size"], data_dir, cell["seed"], hub=False)
        except HubSkipped:
            continue  # from the hub: fetched, and its size checked, when the job runs
        except TaskError as err:
            found.append(f"config key datasets.{cell['task']}: {err}")
        except (OSError, ValueError) as err:  # a damaged local file
            found.append(f"config key datasets.{cell['task']}: cannot read its data: {err}")
    if not problems + found:  # every prompt plus max_new_tokens fits its models' context
        try:
            check_context(cells, ConfigError)
        except ConfigError as err:
            found.append(str(err))
    return infos, problems + found


def fill_defaults(config: dict[str, Any], schema: dict[str, Any], depth: int = 2) -> dict[str, Any]:
    """Fill defaults from the schema, top level and one below (as Snakemake's ``validate(set_default=True)``)."""
    for key, sub in schema["properties"].items():
        if key not in config and "default" in sub:
            config[key] = copy.deepcopy(sub["default"])
        if depth > 1 and isinstance(config.get(key), dict) and "properties" in sub:
            fill_defaults(config[key], sub, depth - 1)
    return config


def expand_cells(config: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Every cell of a checked config: cell id -> {"cell": JSON for ``pipeline generate``, "dims": ...}."""
    cells: dict[str, dict[str, Any]] = {}
    for grid in config["grids"]:
        g = {k: grid.get(k, config[k]) for k in GRID_KEYS}
        for set_name, members in grid["model_sets"].items():
            for method in grid["methods"]:
                spec = _spec(method)
                if not spec.fits(len(members), g["proposer"]):
                    continue
                alone = {"large_model": members[:1], "small_model": members[-1:]}.get(method)  # one model of the set
                names, label = (alone, alone[0]) if alone else (list(members), set_name)
                gammas = _gammas(g["gamma"], spec.kind, len(names), grid["name"]) if spec.speculative else [None]
                if not gammas:
                    raise ConfigError(
                        f"config key gamma: {g['gamma']} has no integer for {method!r} (grid {grid['name']!r}); "
                        "per-model lists apply to *_se methods only"
                    )
                args = {k: v for k, v in g["method_args"].items() if k in spec.accepted_args()}
                if "proposer" in spec.accepted_args():  # not the peers (transformers' own methods)
                    args.setdefault("proposer", g["proposer"])
                if mixed_tokenizers(config["models"], names) and (why := one_tokenizer_only(spec)):
                    raise ConfigError(
                        f"grid {grid['name']!r}, set {set_name!r}: {method!r} needs one shared tokenizer but "
                        f"{', '.join(map(repr, names))} tokenize differently ({why}); the other methods run over "
                        "the union of their vocabularies"
                    )
                restricted = [repr(m) for m in names if _restricted_head(config["models"][m])]
                try:  # the decoder's own check of the method and its arguments, before any job starts
                    spec.check(len(names), args, restricted)
                except ValueError as err:
                    raise ConfigError(f"grid {grid['name']!r}, set {set_name!r}: {err}") from None
                schedules = g["gamma_schedule"] if spec.kind in ("sd", "se") else ["fixed"]  # ours only
                trees = _trees(g["tree"], spec.kind, grid["name"])
                if any(trees) and mixed_tokenizers(config["models"], names):
                    raise ConfigError(
                        f"grid {grid['name']!r}, set {set_name!r}: config key tree: {g['tree']} on a set whose "
                        f"members tokenize differently ({', '.join(map(repr, names))}); token trees run over one "
                        "shared vocabulary: use tree: [null] for this grid (chains run over the union)"
                    )
                for dataset, dopts in g["datasets"].items():
                    for t in g["temperature"]:
                        try:
                            spec.check_temperature(float(t))
                        except ValueError as err:
                            raise ConfigError(f"grid {grid['name']!r}: {err}") from None
                        for gamma, schedule, tree in itertools.product(gammas, schedules, trees):
                            cell_id, cell = _cell(
                                config, g, spec, args, names, label, dataset, dopts, t, gamma, schedule, tree
                            )
                            dims = {
                                "id": cell_id,
                                "experiment": config["experiment"],
                                "grid": grid["name"],
                                "model_set": label,
                                "models": names,
                                "large_model": names[0] if method != "small_model" else None,
                                "method": method,
                                "family": spec.base if spec.base not in ("large_model", "small_model") else "single",
                                "kind": spec.kind,
                                "dataset": dataset,
                                "temperature": float(t),
                                "gamma": _fmt_gamma(cell["gamma"], schedule, tree) if spec.speculative else None,
                                "gamma_schedule": schedule if spec.speculative else None,
                                "tree": tree.label if tree else None,
                                "tree_nodes": tree.nodes if tree else None,
                                "baseline": cell.get("baseline"),
                                "standard": _standard(spec),
                            }
                            if cell_id in cells and cells[cell_id]["cell"] != cell:
                                raise ConfigError(
                                    f"cell {cell_id} is defined twice with different settings (grids "
                                    f"{cells[cell_id]['dims']['grid']!r} and {grid['name']!r}); give one set "
                                    "another name or align the settings"
                                )
                            cells.setdefault(cell_id, {"cell": cell, "dims": dims})
    if not cells:
        raise ConfigError("the config expands to no cells: check that each grid's methods fit its model sets")
    return cells


def _standard(spec) -> str | None:
    """What a cell's speed is compared with: the standard method it speeds up (itself for an ensemble)."""
    if spec.kind != "plain":  # speculative, parallel or a mixture: the standard method of its base
        return spec.base
    return spec.name if spec.ensemble is not None else None


def _restricted_head(model: dict[str, Any]) -> bool:
    distill = model.get("distill")
    restricted = distill is not None and not model.get("full_head") and distill.get("head_tokens") != 0
    return restricted and not own_tokenizer(model)  # a student's head is its own vocabulary's, whole


def _gammas(sweep: list[Any], kind: str, n: int, grid: str) -> list[Any]:
    """The sweep's values that apply: per-model lists only for ``*_se`` (one entry per model), ints for all."""
    out = []
    for value in sweep:
        if isinstance(value, list):
            if kind != "se":
                continue
            if len(value) != n:
                raise ConfigError(
                    f"config key gamma: {value} has {len(value)} entries but grid {grid!r} has a set of {n} "
                    "models; a per-model gamma list needs one entry per model"
                )
        out.append(value)
    return out


def _trees(sweep: list[Any], kind: str, grid: str) -> list[Any]:
    """The grid's trees (``decoding/tree.py``) for a method of ``kind``: each checked; None (a chain) only
    for the methods that cannot take one."""
    from pipeline.decoding.tree import parse_tree

    if kind not in ("sd", "se"):
        return [None]
    try:
        return list(dict.fromkeys(parse_tree(value) for value in sweep))
    except ValueError as err:
        raise ConfigError(f"grid {grid!r}: config key {err}") from None


def _cell(
    config, g, spec, args, names, label, dataset, dopts, t, gamma, schedule, tree=None
) -> tuple[str, dict[str, Any]]:
    if spec.kind == "se" and isinstance(gamma, int) and g["se_large_gamma"] is not None:
        gamma = [g["se_large_gamma"]] + [gamma] * (len(names) - 1)
    cell: dict[str, Any] = {
        "models": [model_entry(config, m) for m in names],
        "method": spec.name,
        "task": dataset,
        "gamma": gamma if gamma is not None else 1,
        "method_args": dict(args),
        "size": dopts.get("size", "tiny"),
        "chat": bool(dopts.get("chat", False)),
        "data_dir": config["data_dir"],
        "max_new_tokens": g["max_new_tokens"],
        "temperature": float(t),
        "top_k": config["top_k"],
        "top_p": config["top_p"],
        "seed": config["seed"],
    }
    if schedule != "fixed":  # fixed cells keep the form they had before schedules existed
        cell["gamma_schedule"] = schedule
    cell_id = f"{dataset}/{label}/{spec.name}-T{float(t):g}"
    if spec.kind != "plain" and config["side_by_side"]:  # it speeds up its base: run the base beside it
        cell["baseline"] = spec.base
        cell["baseline_args"] = {k: v for k, v in args.items() if k in _accepted_args(spec.base)}
    if spec.speculative:
        cell_id += f"-g{_fmt_gamma(gamma, schedule)}"
    if tree is not None:
        cell["tree"] = tree.label
        cell_id += f"-{tree.label}"
    return cell_id, cell


def load_checked(path: Path) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """A config file checked and expanded into cells (ConfigError names what is wrong)."""
    config = check_config(load_config_file(path))
    return config, expand_cells(config)


def main(argv: list[str] | None = None) -> int:
    """``python -m pipeline.workflow CONFIG``: check a config and list its cells."""
    import argparse

    ap = argparse.ArgumentParser(prog="pipeline grid", description="check a workflow config and list its cells")
    ap.add_argument("config", type=Path)
    args = ap.parse_args(argv)
    try:
        config = check_config(load_config_file(args.config))
        cells = expand_cells(config)
        check_local(config, cells)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print("\n".join(cells))
    print(f"{len(cells)} cells", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
