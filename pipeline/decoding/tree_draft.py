"""Drafting a token tree: the tree (nodes, the draws at each node, the drafter's distributions) and the
drafter, which feeds one depth per forward over the nodes it expands (a static shape's all, a dynamic one's
of highest cumulative draft probability) and proposes each node's children: greedy, its top tokens;
sampling, draws with or without replacement; prompt lookup's distinct continuations first (one-hot)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from .ensemble import single_model
from .lookup import PromptLookup
from .proposers import Chain, ModelProposer
from .sampling import Sampling, probs, sample
from .tree_shape import DYNAMIC_BRANCH, DYNAMIC_EXPAND, TreeShape

if TYPE_CHECKING:
    from .engine import Decoder
    from .tree_cache import TreeCache


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


def parts(proposer: Any) -> tuple[PromptLookup | None, ModelProposer | None]:
    """A turn's prompt lookup and model proposer (either may be absent)."""
    chain = proposer.proposers if isinstance(proposer, Chain) else [proposer]
    lookup = next((p for p in chain if isinstance(p, PromptLookup)), None)
    return lookup, next((p for p in chain if isinstance(p, ModelProposer)), None)


class TreeDrafter:
    """Drafts one round's tree for a turn's proposer."""

    def __init__(self, decoder: Decoder, shape: TreeShape, caches: dict[int, TreeCache]):
        self.decoder, self.shape, self.caches = decoder, shape, caches

    def draft(self, proposer: Any, depth: int) -> Tree:
        lookup, model = parts(proposer)
        tree = Tree()
        frontier = [-1]
        for d in range(1, depth + 1):
            expand = self._choose(tree, frontier, d)
            if not expand:
                break
            if model is not None:  # the drafter's rows there (and at the root): one forward of what it lacks
                cache = self.caches[model.index]
                todo = [n for n in expand if n >= 0 and n not in cache.rows]
                if -1 not in cache.rows or todo:
                    cache.feed(self.decoder.tokens, self.decoder.committed, tree, todo)
            for n in expand:
                self._children(tree, n, lookup, model, self._width(d))
            frontier = [i for i, node in enumerate(tree.nodes) if node.depth == d]
        for node in tree.nodes:
            node.by.stats.proposed += 1
        return tree

    def _width(self, depth: int) -> int:
        return DYNAMIC_BRANCH if self.shape.dynamic else self.shape.width(depth)

    def _choose(self, tree: Tree, frontier: list[int], depth: int) -> list[int]:
        """The frontier nodes that get children at ``depth``: all of a static shape's; a dynamic tree's
        ``DYNAMIC_EXPAND`` of highest cumulative draft probability; none past the node budget or an EOS."""
        eos = self.decoder.stopper.eos_ids
        live = [n for n in frontier if n < 0 or tree.nodes[n].token not in eos]
        if self.shape.dynamic:
            live = sorted(live, key=lambda n: -tree.nodes[n].cum if n >= 0 else 0)[:DYNAMIC_EXPAND]
        room = self.shape.nodes - len(tree.nodes)
        return live[: max(0, -(-room // self._width(depth)))] if room > 0 else []

    def _children(self, tree: Tree, n: int, lookup: PromptLookup | None, model: ModelProposer | None, b: int):
        dec = self.decoder
        room = self.shape.nodes - len(tree.nodes)
        if room <= 0:
            return
        context = dec.tokens[: dec.committed] + (tree.tokens(n) if n >= 0 else [])
        cum = 1.0 if n < 0 else tree.nodes[n].cum
        q = None
        if model is not None:
            row = self.caches[model.index].rows[n]
            if dec.audit is not None:
                dec.audit.check(
                    context, len(context), len(context) + 1, [row[None]], [model.index], single_model, dec.sampling
                )
            q = probs(row[None], Sampling.identity() if dec.sampling.greedy else dec.sampling)[0]
            tree.q[n] = q
        found = lookup.continuations(context, min(b, room)) if lookup is not None else []
        for token in found:
            tree.add(n, token, None, cum * (float(q[token]) if q is not None else 1.0), lookup)
        draws = min(b, room) - len(found)
        if model is None or draws <= 0:
            return
        taken = list(found)
        if dec.sampling.greedy:
            order = torch.topk(q, min(len(q), draws + len(taken))).indices.tolist()
            for token in [t for t in order if t not in taken][:draws]:
                tree.add(n, token, None, cum * float(q[token]), model)
            return
        for _ in range(draws):
            dist = q
            if not self.shape.replacement and taken:
                dist = q.clone()
                dist[taken] = 0.0
                if not dist.sum() > 0:
                    break  # every token of q's support drawn already
                dist = dist / dist.sum()
            token = int(sample(dist[None], dec.generator)[0])
            taken.append(token)
            tree.add(n, token, dist, cum * float(q[token]), model)
