"""Token trees: several candidates per position, drafted as a tree and verified in one forward per target model.

This module is the round loop, which a method with a tree hands the decoder (``tree_loop``); its parts:
``tree/shape.py`` (static and dynamic shapes, what is refused), ``tree/nodes.py`` (the tree), ``tree/draft.py`` (its
drafter: one depth per forward under a tree mask), ``tree/cache.py``
(forwards over a tree on either runner; after the round each model keeps only the accepted path in its cache)
and ``tree/verify.py`` (the acceptance rule, walking down from the root). See ``docs/trees.md`` and
``docs/algorithms.md`` ("Token trees").
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from ..ensembles import check_output
from ..sampling import Sampling
from .cache import TreeCache
from .draft import TreeDrafter, models_of
from .nodes import Tree
from .shape import TreeShape, check_tree_models, parse_tree
from .verify import accept_tree

if TYPE_CHECKING:
    from ..loop import Decoder

__all__ = ["Tree", "TreeShape", "check_tree_models", "parse_tree", "tree_loop"]  # what other modules use

# ---- the loop ------------------------------------------------------------------


def tree_loop(shape: TreeShape) -> Callable[[Decoder, list], None]:
    """The decoder's loop (``Decoder.run``'s ``loop``) for trees of ``shape``."""
    return lambda decoder, schedule: run_tree(decoder, schedule, shape)


def run_tree(decoder: Decoder, schedule: list, shape: TreeShape) -> None:
    """The speculative loop with a tree per round: the drafting turns (gamma > 0; in ``*_se`` not the largest
    model's) take rounds in rotation (a rejection restarts it, as the chain loop does), every target model
    verifies each tree in one forward."""
    dec = decoder
    # the largest model's turn (``fixed_turns``) drafts no tree where another model drafts: every tree's
    # verification already runs its forward, and the token after each tree is drawn from the target there
    drafting = [k for k, (_, gamma) in enumerate(schedule) if gamma > 0]
    turns = [k for k in drafting if k not in dec.fixed_turns] or drafting
    models = {*dec.targets} | {m.index for p, _ in schedule for m in models_of(p)}
    caches = {i: TreeCache(dec.members[i].runner, shape.nodes) for i in sorted(models)}
    drafter = TreeDrafter(dec, shape, caches)
    depths = {k: gamma if shape.dynamic else len(shape.branching) for k, (_, gamma) in enumerate(schedule)}
    turn = 0
    while not dec.done:
        k = turns[turn]
        budget = dec.stopper.max_new_tokens - (dec.committed - dec.prompt_len)
        tree = drafter.draft(schedule[k][0], max(0, min(depths[k], budget - 1)))
        path, token = verify_round(dec, tree, caches)
        for cache in caches.values():
            cache.settle(dec.committed, path)
        full = bool(tree.nodes) and len(path) == tree.depth
        if dec.dynamic is not None and k not in dec.fixed_turns and tree.nodes:
            depths[k] = dec.dynamic.next(depths[k], full)
        dec.tokens[dec.committed :] = [tree.nodes[n].token for n in path] + [token]
        dec.commit(len(path) + 1)
        turn = (turn + 1) % len(turns) if full else 0


def verify_round(dec: Decoder, tree: Tree, caches: dict[int, TreeCache]) -> tuple[list[int], int]:
    """Every target model's rows at the root and every node (one forward each), the target distribution
    there, and the acceptance rule's accepted path and next token."""
    nodes = list(range(len(tree.nodes)))
    for i in dec.targets:
        cache = caches[i]
        cache.feed(dec.tokens, dec.committed, tree, [n for n in nodes if n not in cache.rows])
    order = [-1, *nodes]
    rows = [torch.stack([caches[i].rows[n] for n in order]) for i in dec.targets]
    greedy = dec.sampling.greedy
    sampling = Sampling.identity() if greedy else dec.sampling
    target = dec.target_fn(rows, sampling)
    step = dec.committed - dec.prompt_len
    check_output(target, dec.target_fn, step, len(order), rows[0].shape[-1], inputs=rows, sampling=sampling)
    if dec.audit is not None:
        audit_tree(dec, tree, rows)
    dec._show_tree(tree, target)
    clock = time.perf_counter()
    path, token = accept_tree(tree, target, greedy, dec.generator)
    dec.stats.accept_time_s += time.perf_counter() - clock
    dec.stats.record_round(tree.depth, len(path))
    committed = [0, *(n + 1 for n in path)]  # the rows of the positions this round commits
    dec.stats.record_ceiling(None if greedy else target[committed], len(committed))
    checked = {-1, *path}
    for n, node in enumerate(tree.nodes):
        if node.parent in checked:
            node.by.stats.verified += 1
            node.by.stats.accepted += n in path
    dec.stats.tree_nodes += len(tree.nodes)
    return path, token


def audit_tree(dec: Decoder, tree: Tree, rows: list[Tensor]) -> None:
    """The audit of a tree round: the target distribution at the root and every node, and each drafter
    distribution a node's children were drawn from, recomputed from their contexts without a cache."""
    base = dec.tokens[: dec.committed]
    for j, n in enumerate([-1, *range(len(tree.nodes))]):
        context = base + (tree.tokens(n) if n >= 0 else [])
        end = len(context)
        dec.audit.check(context, end, end + 1, [r[j : j + 1] for r in rows], dec.targets, dec.target_fn, dec.sampling)
