"""Token trees: several candidates per position, drafted as a tree and verified in one forward per target model.

A tree hangs under the root, the last committed token. A static shape gives
the branching per depth (``[3, 2, 1]``: three children of the root, two of
each, one of each of those: 15 nodes); a dynamic one (``td16``) grows to a
node budget, each depth expanding the nodes of highest cumulative draft
probability (EAGLE-2 style). The drafter proposes a node's children from its
distribution ``q`` there: greedy, its top ``b`` tokens; sampling, ``b`` draws
(with replacement, or without: ``q`` renormalised over the tokens not yet
drawn); prompt lookup adds the distinct continuations of its matches first
(one-hot). The drafter feeds one depth per forward with a tree attention mask
over its cache; every target model then feeds the whole tree in one forward.
The acceptance rule (``tree_verify.py``) walks down from the root; afterwards
each model keeps only the accepted path in its cache (``compact``: the path's
K/V gathered into place, the rest cropped).

See ``docs/trees.md`` and ``docs/algorithms.md`` ("Token trees").
"""

from __future__ import annotations

import math
import re
import time
from array import array
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from ..errors import ArgumentError
from .ensemble import check_output, check_rows, single_model
from .lookup import PromptLookup
from .proposers import Chain, ModelProposer
from .runner import HFRunner, as_rows, engine_of
from .sampling import Sampling, probs, sample
from .spec import MethodSpec, is_int
from .tree_verify import accept_tree

if TYPE_CHECKING:
    from .engine import Decoder

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


_PATTERN = re.compile(r"^t?(?:(\d+(?:x\d+)*)|d(\d+))(w?)$")


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


def check_tree_models(models: list, spec: MethodSpec) -> None:
    """Refuse, in one line, what a tree cannot run on: a method that does not speculate with our loop, a model
    on a compiled engine, and models with sliding-window layers (their cache cannot be compacted)."""
    if not spec.own_loop:
        raise ArgumentError(f"a tree is for the sd, *_sd and *_se methods; this method's kind is {spec.kind!r}")
    for i, model in enumerate(models):
        if engine_of(model)[0] != "eager":
            raise ArgumentError(f"a tree needs the eager engine; model {i} runs {engine_of(model)[0]!r} (chains only)")
        types = getattr(getattr(model, "config", None), "layer_types", None) or []
        if getattr(getattr(model, "config", None), "sliding_window", None) and any(
            t != "full_attention" for t in types
        ):
            raise ArgumentError(
                f"a tree needs full-attention layers; model {i} has sliding-window layers (decode it with chains)"
            )


# ---- the tree --------------------------------------------------------------------


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


# ---- forwards over a tree ---------------------------------------------------------------


class TreeCache:
    """A runner's slots in the round's tree: which cache slot holds which node; rows it computed (-1: root)."""

    def __init__(self, runner: HFRunner):
        if not isinstance(runner, HFRunner):
            raise ArgumentError(f"a tree needs the eager engine; {type(runner).__name__} decodes chains only")
        self.runner = runner
        self.slots: dict[int, int] = {}
        self.rows: dict[int, Tensor] = {}

    def feed(self, tokens: list[int], committed: int, tree: Tree, nodes: list[int]) -> None:
        """One forward: the committed tokens the runner lacks, then ``nodes``, each seeing the committed
        context and its own ancestors only (a 4D additive mask), at position ``committed - 1 + depth``."""
        runner = self.runner
        fresh = -1 not in self.rows  # the round's first forward: the committed tokens it lacks, the root last
        if fresh and runner.length >= committed:  # the root must be fed to have its row
            runner.crop(committed - 1)
        length = runner.length
        prefix = tokens[length:committed] if fresh else []
        ids = prefix + [tree.nodes[n].token for n in nodes]
        if not ids:
            return
        total = length + len(ids)
        dtype = next(runner.model.parameters()).dtype
        mask = torch.full((len(ids), total), torch.finfo(dtype).min, dtype=dtype, device=runner.device)
        positions = list(range(length, length + len(prefix)))
        for i in range(len(prefix)):
            mask[i, : length + i + 1] = 0
        for j, n in enumerate(nodes):
            self.slots[n] = length + len(prefix) + j
            row = len(prefix) + j
            mask[row, :committed] = 0
            mask[row, [self.slots[a] for a in tree.path(n)]] = 0
            positions.append(committed - 1 + tree.nodes[n].depth)
        keep = len(nodes) + (1 if prefix else 0)
        start = time.perf_counter()
        out = runner.model(
            input_ids=torch.tensor([ids], device=runner.device),
            attention_mask=mask[None, None],
            position_ids=torch.tensor([positions], device=runner.device),
            past_key_values=runner.cache,
            use_cache=True,
            **({"logits_to_keep": keep} if runner._keep_arg else {}),
        )
        rows = check_rows(as_rows(out.logits[0, -keep:, : runner.vocab_size], runner.out_device), runner, keep)
        if runner.sync:
            torch.cuda.synchronize(runner.device)
        runner.stats.forward_time_s += time.perf_counter() - start
        runner.stats.forward_calls += 1
        runner.stats.forwarded_tokens += len(ids)
        runner.cache = out.past_key_values
        runner.length = total
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


def compact(runner: HFRunner, start: int, keep: list[int]) -> None:
    """Move the K/V of cache slots ``keep`` (ascending, >= ``start``) to ``start, start+1, ...``; crop the rest."""
    if keep and keep != list(range(start, start + len(keep))):
        index = torch.tensor(keep, device=runner.device)
        for layer in runner.cache.layers:
            layer.keys[:, :, start : start + len(keep)] = layer.keys.index_select(2, index)
            layer.values[:, :, start : start + len(keep)] = layer.values.index_select(2, index)
    runner.crop(start + len(keep))


# ---- drafting ------------------------------------------------------------------


def lookup_continuations(lookup: PromptLookup, tokens: list[int], limit: int) -> list[int]:
    """Up to ``limit`` distinct tokens that followed earlier matches of the context's tail: longer n-grams
    first, later matches first (the first is ``lookup.propose``'s)."""
    size = array("i").itemsize
    buf = array("i", tokens).tobytes()
    found: list[int] = []
    for n in range(min(lookup.max_ngram, len(tokens) - 1), lookup.min_ngram - 1, -1):
        pattern, end = buf[-n * size :], len(buf) - size
        while len(found) < limit and (at := buf.rfind(pattern, 0, end)) >= 0:
            if at % size == 0 and (token := tokens[at // size + n]) not in found:
                found.append(token)
            end = at + len(pattern) - 1
    return found


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
            if model is not None:
                self._rows(model, tree, [n for n in expand if n >= 0])
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

    def _rows(self, model: ModelProposer, tree: Tree, nodes: list[int]) -> None:
        """The drafter's rows at ``nodes`` (and the root): one forward of what it has not fed."""
        dec = self.decoder
        cache = self.caches[model.index]
        todo = [n for n in nodes if n not in cache.rows]
        if -1 not in cache.rows or todo:
            cache.feed(dec.tokens, dec.committed, tree, todo)

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
        found = lookup_continuations(lookup, context, min(b, room)) if lookup is not None else []
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


# ---- the loop ------------------------------------------------------------------


def run_tree(decoder: Decoder, schedule: list) -> None:
    """The speculative loop with a tree per round: the drafting turns (gamma > 0; in ``*_se`` not the largest
    model's) take rounds in rotation (a rejection restarts it, as the chain loop does), every target model
    verifies each tree in one forward."""
    dec, shape = decoder, decoder.tree
    # the largest model's turn (``fixed_turns``) drafts no tree where another model drafts: every tree's
    # verification already runs its forward, and the token after each tree is drawn from the target there
    drafting = [k for k, (_, gamma) in enumerate(schedule) if gamma > 0]
    turns = [k for k in drafting if k not in dec.fixed_turns] or drafting
    models = {i for i in dec.targets} | {parts(p)[1].index for p, _ in schedule if parts(p)[1] is not None}
    caches = {i: TreeCache(dec.members[i].runner) for i in sorted(models)}
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
        dec._commit(len(path) + 1)
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
    target = dec.target_fn(rows, Sampling.identity() if greedy else dec.sampling)
    check_output(target, dec.target_fn, dec.committed - dec.prompt_len, len(order), rows[0].shape[-1])
    if dec.audit is not None:
        audit_tree(dec, tree, rows)
    path, token = accept_tree(tree, target, greedy, dec.generator)
    dec.stats.record_round(tree.depth, len(path))
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
