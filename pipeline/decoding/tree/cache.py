"""Forwards over a token tree (``extend_masked``: the eager runner's dynamic cache, or the compiled runner's static
cache with its masked graphs, one per bucket of new tokens), and the compaction of a runner's cache after a round."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from ...errors import ArgumentError
from ..ensembles import check_rows
from ..runner import HFRunner
from ..static import StaticRunner

if TYPE_CHECKING:
    from .nodes import Tree


class TreeCache:
    """A runner's slots in the round's tree: which cache slot holds which node; rows it computed (-1: root)."""

    def __init__(self, runner: Any, nodes: int):
        if not isinstance(runner, (HFRunner, StaticRunner)):
            raise ArgumentError(f"a tree needs the eager or the compiled runner; {type(runner).__name__} cannot")
        if isinstance(runner, StaticRunner):
            runner.prepare_masked(nodes + 1)  # room for the tree and its root, its graphs compiled now
        self.runner = runner
        self.slots: dict[int, int] = {}
        self.rows: dict[int, Tensor] = {}

    def feed(self, tokens: list[int], committed: int, tree: Tree, nodes: list[int]) -> None:
        """One forward: the committed tokens the runner lacks, then ``nodes``, each seeing the committed
        context and its own ancestors only, at position ``committed - 1 + depth``."""
        runner = self.runner
        fresh = -1 not in self.rows  # the round's first forward: the committed tokens it lacks, the root last
        if fresh and runner.length >= committed:  # the root must be fed to have its row
            runner.crop(committed - 1)
        length = runner.length
        prefix = tokens[length:committed] if fresh else []
        ids = prefix + [tree.nodes[n].token for n in nodes]
        if not ids:
            return
        visible = torch.zeros((len(ids), length + len(ids)), dtype=torch.bool)
        positions = list(range(length, length + len(prefix)))
        for i in range(len(prefix)):
            visible[i, : length + i + 1] = True
        for j, n in enumerate(nodes):
            self.slots[n] = length + len(prefix) + j
            row = len(prefix) + j
            visible[row, :committed] = True
            visible[row, [self.slots[a] for a in tree.path(n)]] = True
            positions.append(committed - 1 + tree.nodes[n].depth)
        keep = len(nodes) + (1 if prefix else 0)
        rows = check_rows(runner.extend_masked(ids, keep, positions, visible), runner, keep)
        if prefix:
            self.rows[-1] = rows[0]
        for j, n in enumerate(nodes):
            self.rows[n] = rows[keep - len(nodes) + j]

    def settle(self, committed: int, path: list[int]) -> None:
        """Keep the accepted ``path``'s slots (those fed), gathered right after the committed tokens."""
        keep = [self.slots[n] for n in path if n in self.slots]
        if self.slots:
            compact(self.runner, committed, keep)
        self.slots, self.rows = {}, {}


def compact(runner: HFRunner | StaticRunner, start: int, keep: list[int]) -> None:
    """Move the K/V of cache slots ``keep`` (ascending, >= ``start``) to ``start, start+1, ...``; crop the rest."""
    if keep and keep != list(range(start, start + len(keep))):
        index = torch.tensor(keep, device=runner.device)
        for layer in runner.cache.layers:
            layer.keys[:, :, start : start + len(keep)] = layer.keys.index_select(2, index)
            layer.values[:, :, start : start + len(keep)] = layer.values.index_select(2, index)
    runner.crop(start + len(keep))
    for follower in getattr(runner, "followers", ()):  # what reads the runner's forwards by slot (feature.py)
        follower.compact(start, keep)
