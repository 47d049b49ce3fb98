"""A model's ``config.json``, typed before anything is built from it: one check for every reader (the preflight, the
model loader and so ``pipeline prepare``, the EAGLE and EAGLE-3 checkpoint readers).

Its schema is ``records.CONFIG_JSON`` (each value's type and range: whole numbers that are real integers, a known
activation and dtype name, a positive rope base); here, what one value says of another: heads that divide the
width, query heads that the key-value heads divide, and no weight matrix past ``MAX_MATRIX`` elements (a
``vocab_size`` or ``intermediate_size`` that could never be allocated). Each problem is one line naming the file,
the key, the value and what is accepted.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from ..errors import UserError
from ..files import read_user_json
from ..records import CONFIG_JSON, schema_problems
from .spec import ModelError

# elements of one weight matrix (vocab_size or intermediate_size by hidden_size): 32 GiB in bfloat16, past any
# model this project runs (Llama-3.1-405B's largest is 2.1e9)
MAX_MATRIX = 2**34


def config_json_problems(config: Any, where: str, complete: bool = True) -> list[str]:
    """One line per value of a config.json that no model can be built from (``CONFIG_JSON``: type, sign, range;
    then ``shape_problems``), naming ``where``, the key and what is accepted. ``complete``: the keys every model
    states are required (a checkpoint's config, ``complete=False``, is checked on the keys it gives)."""
    schema = CONFIG_JSON if complete else {**CONFIG_JSON, "required": []}
    problems = first_per_key(schema_problems(schema, config, where))
    if problems or not isinstance(config, dict):
        return problems
    return shape_problems(config, where)


def first_per_key(lines: list[str]) -> list[str]:
    """The first line of each key (an infinite ``num_hidden_layers`` is neither a whole number nor below the
    maximum: said once)."""
    return list({line.split("=", 1)[0]: line for line in reversed(lines)}.values())[::-1]


def shape_problems(config: dict[str, Any], where: str) -> list[str]:
    """What the config's values say of each other (each already of its type): finite numbers, heads that divide
    the width (where no head_dim is given), key-value heads that divide the heads, matrices that fit in memory."""
    lines = [
        f"{where}: {key}={value} is not accepted (a finite number > 0)"
        for key, value in [*config.items(), *(config.get("rope_scaling") or {}).items()]
        if key in ("rope_theta", "rms_norm_eps", "factor") and isinstance(value, float) and not math.isfinite(value)
    ]
    hidden, heads, kv = config.get("hidden_size"), config.get("num_attention_heads"), config.get("num_key_value_heads")
    if hidden and heads and config.get("head_dim") is None and hidden % heads:
        lines.append(
            f"{where}: hidden_size={hidden} is not accepted with num_attention_heads={heads} (a multiple of the "
            "heads, each head hidden_size / heads wide, or a head_dim given)"
        )
    if heads and kv and heads % kv:
        lines.append(
            f"{where}: num_key_value_heads={kv} is not accepted with num_attention_heads={heads} (a divisor of the "
            "heads: each key-value head serves a whole group)"
        )
    for key in ("vocab_size", "intermediate_size"):
        if hidden and config.get(key) and config[key] * hidden > MAX_MATRIX:
            lines.append(
                f"{where}: {key}={config[key]} is not accepted with hidden_size={hidden} (a weight matrix of "
                f"{config[key] * hidden:,} elements; at most {MAX_MATRIX:,}, so that the weights fit in memory)"
            )
    return lines


def check_config_json(config: Any, where: str, complete: bool = True) -> dict[str, Any]:
    """``config`` itself, or a one-line ``ModelError``: its first problem (``config_json_problems``) and how many
    more there are."""
    if problems := config_json_problems(config, where, complete):
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise ModelError(problems[0] + more)
    return config


def read_config_json(file: Path, what: str, complete: bool = True) -> dict[str, Any]:
    """The config.json ``file`` (``what`` it is, for a message), read through the I/O layer (a link, a pipe, a
    file past its limit or not JSON: one line) and checked (``check_config_json``) before anything is built."""
    try:
        config = read_user_json(file, what)
    except UserError as err:
        raise ModelError(str(err)) from None
    return check_config_json(config, f"{what} {file}", complete)
