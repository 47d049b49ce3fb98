"""A token tree's nodes: what was drawn at each node and from which distribution (a leaf module: the drafter
builds a ``Tree``, the acceptance rule walks it, the caches feed its nodes)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from torch import Tensor


@dataclass
class Node:
    token: int
    parent: int  # -1: a child of the root
    depth: int  # 1 for the root's children
    cum: float  # cumulative draft probability of the path to it
    by: Any  # the proposer that drafted it (its stats count it)


@dataclass
class Tree:
    nodes: list[Node] = field(default_factory=list)
    draws: dict[int, list[tuple[int, Tensor | None]]] = field(default_factory=dict)  # node -> (token, q) in order
    children: dict[int, dict[int, int]] = field(default_factory=dict)  # node -> token -> child
    q: dict[int, Tensor] = field(default_factory=dict)  # node -> the drafter's distribution there

    def add(self, parent: int, token: int, q: Tensor | None, cum: float, by: Any) -> None:
        """One draw at ``parent``: ``token`` drawn from ``q`` (None: one-hot); a repeat joins its sibling."""
        self.draws.setdefault(parent, []).append((token, q))
        kids = self.children.setdefault(parent, {})
        if token not in kids:
            depth = 1 if parent < 0 else self.nodes[parent].depth + 1
            kids[token] = len(self.nodes)
            self.nodes.append(Node(token, parent, depth, cum, by))

    def path(self, node: int) -> list[int]:
        """The nodes from the root's child down to ``node``."""
        out = []
        while node >= 0:
            out.append(node)
            node = self.nodes[node].parent
        return out[::-1]

    def tokens(self, node: int) -> list[int]:
        return [self.nodes[n].token for n in self.path(node)]

    @property
    def depth(self) -> int:
        return max((n.depth for n in self.nodes), default=0)
