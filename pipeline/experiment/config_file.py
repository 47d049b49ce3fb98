"""A workflow config file read (``load_config_file``): YAML or JSON, duplicate keys refused, its size, depth and
integers bounded before it is built; what it holds is checked by ``config.py``."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import yaml

from ..errors import UserError
from ..files import read_user_text


class ConfigError(UserError):
    """A bad config value: one line naming the key, the value and what is accepted."""


class _StrictLoader(yaml.SafeLoader):
    """YAML that refuses a key given twice in one mapping (plain YAML keeps the last one silently)."""

    def construct_mapping(self, node, deep=False):
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if key_node.tag == MERGE:  # a merge key (<<): its keys may be overridden by the mapping's own
                continue
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


MERGE = "tag:yaml.org,2002:merge"
MAX_VALUES = 100_000  # values of a config once its aliases are expanded (a config has hundreds)
MAX_DEPTH = 64  # nesting (a config nests 5 deep)
MAX_INT = 2**63  # an integer a config may hold, exclusive (its largest are seeds and sizes)


def _expanded(root) -> tuple[int, int]:
    """The number of values a YAML node graph holds once its aliases are expanded, and its depth, without
    expanding it (each node once: an alias bomb is counted, not built); (inf, inf) for a graph that holds itself."""
    size: dict[int, int] = {}
    depth: dict[int, int] = {}
    open_nodes: set[int] = set()
    stack = [(root, False)]
    while stack:
        node, done = stack.pop()
        children = (
            [n for pair in node.value for n in pair]
            if isinstance(node, yaml.MappingNode)
            else (node.value if isinstance(node, yaml.SequenceNode) else [])
        )
        if done:
            open_nodes.discard(id(node))
            size[id(node)] = 1 + sum(size[id(c)] for c in children)
            depth[id(node)] = 1 + max((depth[id(c)] for c in children), default=0)
            continue
        if id(node) in size:
            continue
        if id(node) in open_nodes:
            return math.inf, math.inf
        open_nodes.add(id(node))
        stack.append((node, True))
        stack += [(c, False) for c in children if id(c) not in size]  # an open one among them: a cycle, found above
    return size[id(root)], depth[id(root)]


def _big_int(value: Any, path: tuple = ()) -> tuple[tuple, int] | None:
    """The path and value of the first integer of ``value`` too large for a config (|n| >= MAX_INT), or None."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= MAX_INT:
        return path, value
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    return next((found for k, v in items if (found := _big_int(v, (*path, k))) is not None), None)


def load_config_file(path: Path) -> dict[str, Any]:
    """A YAML or JSON config file, duplicate keys refused, its size, depth and integers bounded (an alias bomb
    is counted before it is built); ConfigError names what is wrong."""
    path = Path(path)
    try:
        loader = _StrictLoader(read_user_text(path, "config file"))
        try:
            node = loader.get_single_node()
            values, depth = _expanded(node) if node is not None else (0, 0)
            if values == math.inf:
                raise ConfigError(
                    f"config file {path}: an alias refers to a value that contains it (a value that holds itself)"
                )
            if values > MAX_VALUES or depth > MAX_DEPTH:
                what = (
                    f"nested {depth} deep" if depth > MAX_DEPTH else f"{values:,} values once its aliases are expanded"
                )
                raise ConfigError(
                    f"config file {path}: {what}; a config holds at most {MAX_VALUES:,} values, nested at most "
                    f"{MAX_DEPTH} deep"
                )
            data = None if node is None else loader.construct_document(node)
        finally:
            loader.dispose()
    except UserError as err:
        raise ConfigError(str(err)) from None
    except yaml.YAMLError as err:
        raise ConfigError(f"config file {path} is not valid YAML: {str(err).splitlines()[0]}") from None
    except RecursionError:
        raise ConfigError(
            f"config file {path}: nested too deep to read; a config nests at most {MAX_DEPTH} deep"
        ) from None
    except ValueError:  # an integer of more digits than Python converts (4,300)
        raise ConfigError(
            f"config file {path}: an integer of thousands of digits; a config's are below {MAX_INT:,}"
        ) from None
    if (found := _big_int(data)) is not None:
        key = ".".join(map(str, found[0])) or "(top level)"
        raise ConfigError(
            f"config key {key}: {found[1]} is not accepted; expected an integer of at most {MAX_INT - 1:,} in size"
        )
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path}: expected a mapping of keys to values, got a {type(data).__name__}")
    return data
