"""The acceptance rule over a token tree (``docs/algorithms.md``, "Token trees").

Walk down from the root. At a node with target distribution ``r`` (a row of
the target, probabilities; argmax tokens if greedy):

* greedy: follow the child equal to ``argmax r``; if there is none, emit
  ``argmax r`` (at a leaf: the bonus token);
* sampling: the node's draws ``x_1..x_b``, each with the distribution ``q_i``
  it was drawn from (the drafter's ``q``; ``q`` renormalised over the tokens
  not yet drawn when drawn without replacement; one-hot for prompt lookup), are
  tried in the order drawn: accept ``x_i`` with probability
  ``min(1, r_i(x_i) / q_i(x_i))`` with ``r_1 = r`` and
  ``r_{i+1} = norm(max(0, r_i - q_i))``, and move to its child; if all are
  rejected emit a draw of the last residual ``r_{b+1}`` (at a leaf, with no
  draws: of ``r``, the bonus token).

Each step is the chain rule of ``verify.py`` (``accept_one``, ``residual``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor

from ..sampling import sample
from ..verify import accept_one, residual

if TYPE_CHECKING:
    from .nodes import Tree


def accept_tree(tree: Tree, target: Tensor, greedy: bool, generator: torch.Generator | None) -> tuple[list[int], int]:
    """The accepted path (node indices, from the root's child down) and the token after it.

    ``target``: ``[1 + nodes, V]``, row 0 at the root, row ``1 + n`` at node ``n``; probabilities
    (greedy: any scores whose argmax is the target's)."""
    if greedy:
        best = target.argmax(dim=-1).tolist()
    path, node = [], -1
    while True:
        if greedy:
            token = best[node + 1]
            child = tree.children.get(node, {}).get(token)
            if child is None:
                return path, token
        else:
            r, child = target[node + 1], None
            for token, q in tree.draws.get(node, []):
                if accept_one(r, q, token, generator):
                    child = tree.children[node][token]
                    break
                r = residual(r, q, token)
                r = r / r.sum()  # r_{i+1} = norm(max(0, r_i - q_i))
            if child is None:
                return path, int(sample(r[None], generator)[0])
        path.append(child)
        node = child
