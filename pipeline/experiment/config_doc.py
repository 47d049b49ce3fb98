"""config/README.md from the config's JSON schema (workflow/schemas/config.schema.yaml): every key, its type,
default and description, so the two cannot drift apart (a test regenerates it and compares).

    python -m pipeline.experiment.config_doc            # rewrite config/README.md
    python -m pipeline.experiment.config_doc --check    # exit 1 when config/README.md is not what the schema gives
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import yaml

from pipeline.files import generated_page

from .. import ROOT

SCHEMA = ROOT / "workflow" / "schemas" / "config.schema.yaml"
README = ROOT / "config" / "README.md"

HEADER = """# Configuration

Generated from `workflow/schemas/config.schema.yaml` by `python -m pipeline.experiment.config_doc`; edit the schema, not
this file (`tests/test_results_publish.py` checks they agree).

`config/default.yaml` is the embedded default (`snakemake --cores 2`); `config/paper.yaml` is the paper's grid
(`snakemake --configfile config/paper.yaml`); `config/paper_reported.yaml` holds the speed-ups the paper reports,
set beside ours in `tables/paper_vs_ours`. `python -m pipeline.experiment.checks CONFIG` checks a config and lists its
cells. A bad value stops the workflow with one line naming it and what is accepted.

"""


def _resolve(node: dict[str, Any], schema: dict[str, Any]) -> dict[str, Any]:
    """A schema node with its ``$ref`` (into ``definitions``) merged under its own keys."""
    ref = node.get("$ref")
    if not ref:
        return node
    target = schema
    for part in ref.removeprefix("#/").split("/"):
        target = target[part]
    return {**_resolve(target, schema), **{k: v for k, v in node.items() if k != "$ref"}}


def _type(node: dict[str, Any], schema: dict[str, Any]) -> str:
    node = _resolve(node, schema)
    if "enum" in node:
        return " | ".join(json.dumps(v) for v in node["enum"])
    if "oneOf" in node:
        return " or ".join(_type(n, schema) for n in node["oneOf"])
    kind = node.get("type", "")
    kind = " or ".join(kind) if isinstance(kind, list) else kind
    if kind == "array" and "items" in node:
        return f"list of ({_type(node['items'], schema)})"
    return kind or "any"


def _cell(text: Any) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def rows(node: dict[str, Any], schema: dict[str, Any], prefix: str = "") -> list[tuple[str, str, str, str]]:
    """(key, type, default, description) of every key under ``node``, nested keys as ``a.b``, ``a[].b``,
    ``a.<name>.b``."""
    out = []
    for name, child in node.get("properties", {}).items():
        child = _resolve(child, schema)
        key = f"{prefix}{name}"
        default = json.dumps(child["default"]) if "default" in child else ""
        out.append((key, _type(child, schema), default, child.get("description", "")))
        out += rows(child, schema, f"{key}.")
        items = child.get("items")
        if isinstance(items, dict) and "properties" in _resolve(items, schema):
            out += rows(_resolve(items, schema), schema, f"{key}[].")
        extra = child.get("additionalProperties")
        if isinstance(extra, dict) and "properties" in _resolve(extra, schema):
            out += rows(_resolve(extra, schema), schema, f"{key}.<name>.")
    return out


def render_page(schema_path: Path = SCHEMA) -> str:
    schema = yaml.safe_load(Path(schema_path).read_text())
    lines = [HEADER + _cell(schema.get("description", "")), "", "Required: " + ", ".join(schema["required"])]
    lines += ["", "| key | type | default | description |", "| --- | --- | --- | --- |"]
    for key, kind, default, text in rows(schema, schema):
        lines.append(f"| `{key}` | {_cell(kind)} | {_cell(default)} | {_cell(text)} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    return generated_page(argv, "pipeline.experiment.config_doc", __doc__, README, "the schema", render_page)


if __name__ == "__main__":
    sys.exit(main())
