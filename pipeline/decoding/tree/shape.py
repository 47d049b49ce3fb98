"""Token tree shapes: static (branching per depth) or dynamic (a node budget), parsed from a config or an
argument, and what a tree refuses to run on (``docs/trees.md``)."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ...errors import ArgumentError
from ..forms import FORMS
from ..spec import MethodSpec, is_int

MAX_NODES = 64  # the most nodes a tree may hold (each is one more query in every target forward)
DYNAMIC_EXPAND = 2  # a dynamic tree expands this many nodes per depth (those of highest cumulative probability)
DYNAMIC_BRANCH = 3  # ... each with this many children


@dataclass(frozen=True)
class TreeShape:
    """A static shape (``branching`` per depth) or a dynamic one (``budget`` nodes); ``replacement``: sampled
    children drawn with replacement (else without)."""

    branching: tuple[int, ...] = ()
    budget: int = 0
    replacement: bool = True

    @property
    def dynamic(self) -> bool:
        return not self.branching

    @property
    def nodes(self) -> int:
        """The node budget: every node of a full static tree, or the dynamic budget."""
        if self.dynamic:
            return self.budget
        return sum(math.prod(self.branching[: d + 1]) for d in range(len(self.branching)))

    @property
    def label(self) -> str:
        """How a cell id names it: ``t3x2x1``, ``td16`` (``w`` appended: drawn without replacement)."""
        body = f"d{self.budget}" if self.dynamic else "x".join(map(str, self.branching))
        return f"t{body}" + ("" if self.replacement else "w")

    def width(self, depth: int) -> int:
        """Children per expanded node at ``depth`` (1-based) of a static shape (the last repeats)."""
        return self.branching[min(depth, len(self.branching)) - 1]


_PATTERN = re.compile(r"^t?(?:(\d{1,6}(?:x\d{1,6})*)|d(\d{1,6}))(w?)$")  # digits bounded: no 5,000-digit int


def parse_tree(value: Any) -> TreeShape | None:
    """A tree from its config or argument form: None (no tree), a list of branchings ``[3, 2, 1]``, an int
    (a dynamic budget), or a label (``3x2x1``, ``t3x2x1``, ``d16``, ``td16``; a trailing ``w``: sampled
    children drawn without replacement). One-line ArgumentError for anything else."""
    if value is None or isinstance(value, TreeShape):
        return value
    accepted = "a list of branchings like [3, 2, 1], a node budget like 16, or a label like '3x2x1', 'd16', 'd16w'"
    branching, budget, replacement = None, 0, True
    if isinstance(value, (list, tuple)) and value and all(is_int(b) for b in value):
        branching = tuple(value)
    elif is_int(value):
        budget = value
    elif isinstance(value, str) and (match := _PATTERN.match(value.strip())):
        static, dynamic, without = match.groups()
        branching = tuple(int(b) for b in static.split("x")) if static else None
        budget, replacement = int(dynamic or 0), not without
    else:
        raise ArgumentError(f"tree={value!r}: expected {accepted}")
    if branching is not None and not all(b >= 1 for b in branching):
        raise ArgumentError(f"tree={value!r}: every branching must be an int >= 1")
    shape = TreeShape(branching or (), budget, replacement)
    if not 1 <= shape.nodes <= MAX_NODES:
        raise ArgumentError(f"tree={value!r} holds {shape.nodes} nodes: expected 1..{MAX_NODES}")
    return shape


def tree_problem(spec: MethodSpec) -> str | None:
    """Why a token tree cannot run ``spec`` (None: it can), the one home of the rule: a tree is drafted and verified
    by our own speculative loop, so only the forms that declare ``own_loop`` (``forms.py``) take one."""
    if spec.own_loop:
        return None
    forms = ["sd", *(f"*{f.suffix}" for f in FORMS if f.own_loop and f.suffix)]
    return f"a tree is for the {', '.join(forms[:-1])} and {forms[-1]} methods; {spec.name!r} is of kind {spec.kind!r}"


def mixed_tokenizers_problem(names: Sequence[str] = ()) -> str:
    """Why a token tree cannot run on members that tokenize differently, in the words the config check and
    ``generate`` both say it (``names``: the members, where known)."""
    which = f" ({', '.join(map(repr, names))})" if names else ""
    return (
        f"models of different tokenizers{which}: token trees run over one shared vocabulary; drop the tree (chains "
        "run over the union) or use models of one tokenizer"
    )


def check_tree_models(models: list, spec: MethodSpec) -> None:
    """Refuse, in one line, what a tree cannot run on: a method that does not speculate with our loop
    (``tree_problem``), and models with sliding-window layers (their cache cannot be compacted)."""
    if why := tree_problem(spec):
        raise ArgumentError(why)
    for i, model in enumerate(models):
        config = getattr(model, "config", None)
        types = getattr(config, "layer_types", None) or []
        if getattr(config, "sliding_window", None) and any(t != "full_attention" for t in types):
            raise ArgumentError(
                f"a tree needs full-attention layers; model {i} has sliding-window layers (decode it with chains)"
            )
