"""Drafting a token tree: the tree (nodes, the draws at each node, the drafter's distributions) and the
drafter, which feeds one depth per forward over the nodes it expands (a static shape's all, a dynamic one's
of highest cumulative draft probability) and proposes each node's children: greedy, its top tokens;
sampling, draws with or without replacement. A turn's proposers take part through the ``Proposer`` protocol
(``proposers/base.py``): one-hot candidates (``continuations``, as prompt lookup's) come first, in the chain's order,
then draws from the first distribution a proposer gives there (a model's row from its tree cache, or ``logits``,
as the feature head's)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from ..proposers import ModelProposer, parts
from ..sampling import Sampling, probs, sample
from .nodes import Tree
from .shape import DYNAMIC_BRANCH, DYNAMIC_EXPAND, TreeShape

if TYPE_CHECKING:
    from ..loop import Decoder
    from .cache import TreeCache


def models_of(proposer: Any) -> list[ModelProposer]:
    """A turn's model proposers (their rows come from the round's tree caches)."""
    return [p for p in parts(proposer) if isinstance(p, ModelProposer)]


class TreeDrafter:
    """Drafts one round's tree for a turn's proposer."""

    def __init__(self, decoder: Decoder, shape: TreeShape, caches: dict[int, TreeCache]):
        self.decoder, self.shape, self.caches = decoder, shape, caches

    def draft(self, proposer: Any, depth: int) -> Tree:
        chain = parts(proposer)
        for p in chain:  # a round begins: the proposers that are not models take in the final tokens
            if not isinstance(p, ModelProposer):
                p.feed(self.decoder.tokens, self.decoder.committed)
        tree = Tree()
        frontier = [-1]
        for d in range(1, depth + 1):
            expand = self._choose(tree, frontier, d)
            if not expand:
                break
            rows = self._rows(tree, expand, chain)
            for n in expand:
                self._children(tree, n, chain, rows.get(n), self._width(d))
            frontier = [i for i, node in enumerate(tree.nodes) if node.depth == d]
        for node in tree.nodes:
            node.by.stats.proposed += 1
        return tree

    def _context(self, tree: Tree, n: int) -> list[int]:
        dec = self.decoder
        return dec.tokens[: dec.committed] + (tree.tokens(n) if n >= 0 else [])

    def _rows(self, tree: Tree, expand: list[int], chain: list[Any]) -> dict[int, tuple[Any, Tensor]]:
        """Per expanded node, the first proposer of the chain with a distribution there and its logits row: a
        model's from its tree cache (one forward of the nodes it lacks), another's from its ``logits``."""
        found: dict[int, tuple[Any, Tensor]] = {}
        wanted: dict[int, list[int]] = {}  # model index -> the nodes it gives the row of
        for n in expand:
            for p in chain:
                if isinstance(p, ModelProposer):
                    wanted.setdefault(p.index, []).append(n)
                    break
                row = p.logits(self._context(tree, n)) if hasattr(p, "logits") else None
                if row is not None:
                    found[n] = (p, row)
                    break
        for index, nodes in wanted.items():
            cache = self.caches[index]
            todo = [n for n in nodes if n >= 0 and n not in cache.rows]
            if -1 not in cache.rows or todo:
                cache.feed(self.decoder.tokens, self.decoder.committed, tree, todo)
            model = next(p for p in chain if isinstance(p, ModelProposer) and p.index == index)
            found.update({n: (model, cache.rows[n]) for n in nodes})
        return found

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

    def _children(self, tree: Tree, n: int, chain: list[Any], dist: tuple[Any, Tensor] | None, b: int) -> None:
        dec = self.decoder
        room = self.shape.nodes - len(tree.nodes)
        if room <= 0:
            return
        context = self._context(tree, n)
        cum = 1.0 if n < 0 else tree.nodes[n].cum
        maker, q = None, None
        if dist is not None:
            maker, row = dist
            if dec.audit is not None:
                dec.audit.check_proposer_row(maker, context, row, dec.sampling)
            q = probs(row[None], Sampling.identity() if dec.sampling.greedy else dec.sampling)[0]
            tree.q[n] = q
        taken: list[int] = []
        for p in chain:  # one-hot candidates first (prompt lookup's distinct continuations), in the chain's order
            if hasattr(p, "continuations") and len(taken) < min(b, room):
                for token in p.continuations(context, min(b, room) - len(taken)):
                    if token >= 0 and token not in taken:  # a negative id: a prompt token no proposal names
                        taken.append(token)
                        tree.add(n, token, None, cum * (float(q[token]) if q is not None else 1.0), p)
        draws = min(b, room) - len(taken)
        if q is None or draws <= 0:
            return
        if dec.sampling.greedy:
            order = torch.topk(q, min(len(q), draws + len(taken))).indices.tolist()
            for token in [t for t in order if t not in taken][:draws]:
                tree.add(n, token, None, cum * float(q[token]), maker)
            return
        for _ in range(draws):
            dist_q = q
            if not self.shape.replacement and taken:
                dist_q = q.clone()
                dist_q[taken] = 0.0
                if not dist_q.sum() > 0:
                    break  # every token of q's support drawn already
                dist_q = dist_q / dist_q.sum()
            token = int(sample(dist_q[None], dec.generator)[0])
            taken.append(token)
            tree.add(n, token, dist_q, cum * float(q[token]), maker)
