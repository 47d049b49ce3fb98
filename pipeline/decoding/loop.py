"""The decoding loops: one autoregressive, one speculative, over runners.

State is one token list: ``tokens[:committed]`` are final (prompt and emitted
tokens), ``tokens[committed:]`` are pending proposals. Each model
(``Member``, ``member.py``) has fed some prefix of that list to its runner and remembers the
logits rows it computed for positions not yet committed, so a row is never
computed twice and a proposer's drafting rows double as its verification rows.

The speculative loop covers every speculative method with one schedule, a
cyclic list of turns ``(proposer, gamma)`` (``proposers/base.py``). On its turn a
proposer is fed every token it has not yet seen (a model: one forward), the
pending tokens that every target model has now seen are verified
(``verify.py``), and the proposer then drafts up to ``gamma`` tokens. If after
verification every target model already knows the next position, the next
token is sampled from the target directly (the bonus).

* ``sd``:    ``[(draft, g), (target, 0)]``, target ``[target]``
* ``*_sd``:  ``[(proposer, g), (other, 0), ...]``, target: every model
* ``*_se``:  ``[(m_1, g_1), (m_2, g_2), ...]`` in rotation, target: every model

Prompt lookup proposes alone (``[(lookup, g), (m, 0), ...]``) or chained
before each model (``lookup+draft``).

The mixture loop (``*_me``) samples ``r = sum_k w_k p_k`` in two steps: a
member ``k ~ Categorical(w)``, then the token from ``p_k`` alone; only ``k``
is fed, the others catch up (one forward) when next drawn. Its speculative
form (``*_me_sd``, schedule ``[(drafter, g)]``) draws each position's member
once, ahead of its token, and decodes the runs of positions drawn for another
member speculatively (``_mixture``, ``_verify_mixture``).

A rejection discards every pending token and restarts the schedule. A method
with a token tree hands ``run`` the tree's round loop (``tree/loop.py``), which
drafts through the same proposers and commits with ``commit``.

A dynamic gamma (``DynamicGamma``, ``_adapt_gammas``) changes a turn's gamma
between rounds by verified outcomes only, so every method stays exact. The
``E_p`` methods run the autoregressive loop with the members' forwards issued
concurrently (``parallel.py``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from .ensembles import check_output, single_model
from .member import Member, Stopper
from .proposers import Proposal, Proposer
from .sampling import Sampling, probs, sample
from .stats import GenerationStats
from .verify import verify_greedy, verify_sampled

if TYPE_CHECKING:
    from .audit import Audit
    from .parallel import ConcurrentForwards


TargetFn = Callable[[Sequence[Tensor], Sampling], Tensor]


@dataclass(frozen=True)
class DynamicGamma:
    """A turn's gamma between rounds: ``+increase`` after a round whose proposals were all accepted,
    ``-decrease`` after a rejection, within ``[low, high]``; it starts at the turn's configured gamma.
    The default is the heuristic of transformers' assisted generation, bounded above."""

    increase: int = 2
    decrease: int = 1
    low: int = 1
    high: int = 16

    def next(self, gamma: int, all_accepted: bool) -> int:
        step = self.increase if all_accepted else -self.decrease
        return min(self.high, max(self.low, gamma + step))


@dataclass
class Decoder:
    members: list[Member]
    targets: list[int]  # members whose logits form the target distribution, in ensemble order
    target_fn: TargetFn
    sampling: Sampling
    stopper: Stopper
    generator: torch.Generator | None
    stats: GenerationStats
    device: torch.device
    audit: Audit | None = None  # tests: every distribution recomputed from scratch
    concurrent: ConcurrentForwards | None = None  # E_p: the autoregressive loop's forwards run concurrently
    dynamic: DynamicGamma | None = None  # None: every turn keeps its gamma
    fixed_turns: frozenset[int] = frozenset()  # turns that keep their gamma under a dynamic schedule (and a tree)
    mixture: Tensor | None = None  # [1, len(targets)]: the weights of a mixture method (one member per position)
    watchers: list = field(default_factory=list)  # proposers that read the target's rows (NamedProposer.watches)
    least_reach: float = 0.0  # a chain stops before a proposal whose reach is below this (``_draft``); 0: never

    def run(
        self,
        prompt: list[int],
        schedule: list[tuple[Proposer, int]] | None,
        loop: Callable[[Decoder, list[tuple[Proposer, int]]], None] | None = None,
    ) -> list[int]:
        """Decode after ``prompt``: autoregressively (no ``schedule``), by mixture, or speculatively with the
        chain loop or the ``loop`` the method gives (a token tree's, ``tree.tree_loop``)."""
        self.tokens = list(prompt)
        self.prompt_len = self.committed = len(prompt)
        self.pending: list[Proposal] = []  # one per token of tokens[committed:]
        self.done = self.stopper.max_new_tokens <= 0
        if self.done:
            self.stats.stop_reason = "max_new_tokens"
        self.start = time.perf_counter()
        if not self.done:
            if self.mixture is not None:
                self._mixture(schedule)
            elif schedule is None:
                self._autoregressive()
            elif loop is not None:
                loop(self, schedule)
            else:
                self._speculative(schedule)
        return self.tokens[self.prompt_len : self.committed]

    # ---- the target distribution -------------------------------------------------

    def _target(self, start: int, stop: int) -> Tensor:
        """Target rows for positions [start, stop): probabilities, or argmax tokens if greedy."""
        rows = [self.members[i].span(start, stop) for i in self.targets]
        if self.audit is not None:
            self.audit.check(self.tokens, start, stop, rows, self.targets, self.target_fn, self.sampling)
        step, vocab = start - self.prompt_len, rows[0].shape[-1]
        if self.sampling.greedy:
            if self.target_fn is single_model:  # argmax softmax(l) = argmax l: skip the softmax
                out = check_output(rows[0], single_model, step, stop - start, vocab, logits=True)
                self._show(start, stop, out, logits=True)
            else:
                out = self.target_fn(rows, Sampling.identity())
                out = check_output(out, self.target_fn, step, stop - start, vocab, inputs=rows)
                self._show(start, stop, out)
            return out.argmax(dim=-1)
        out = self.target_fn(rows, self.sampling)
        out = check_output(out, self.target_fn, step, stop - start, vocab, inputs=rows, sampling=self.sampling)
        self._show(start, stop, out)
        return out

    def _show(self, start: int, stop: int, rows: Tensor, logits: bool = False) -> None:
        """The target's probabilities at positions [start, stop) to the proposers that watch them (before
        acceptance); ``logits``: ``rows`` are the target's logits (greedy, one model), made probabilities here."""
        if not self.watchers:
            return
        if logits:
            rows = rows.softmax(dim=-1)
        for watcher in self.watchers:
            watcher.observe(self.tokens[start - 1 : stop - 1], rows)

    def _show_tree(self, tree, rows: Tensor) -> None:
        """A token tree's target rows (the root's, then each node's) to the proposers that watch them."""
        if self.watchers:
            before = [self.tokens[self.committed - 1], *(node.token for node in tree.nodes)]
            for watcher in self.watchers:
                watcher.observe(before, rows)

    def _draw_target(self) -> int:
        dist = self._target(self.committed, self.committed + 1)
        self.stats.record_ceiling(None if self.sampling.greedy else dist, 1)
        clock = time.perf_counter()
        token = int(dist[0] if self.sampling.greedy else sample(dist, self.generator)[0])
        self.stats.accept_time_s += time.perf_counter() - clock
        return token

    # ---- committing ---------------------------------------------------------------

    def commit(self, count: int) -> None:
        """Make the next ``count`` tokens final, stopping early if a stop condition hits."""
        start = self.committed
        for i in range(start, start + count):
            if self.stats.time_to_first_token_s is None:
                self.stats.time_to_first_token_s = time.perf_counter() - self.start
            reason = self.stopper.reason(self.tokens, self.prompt_len, i + 1)
            if reason is not None:
                self.committed = i + 1
                del self.tokens[i + 1 :]
                self.stats.stop_reason, self.done = reason, True
                return
        self.committed = start + count

    # ---- the loops ----------------------------------------------------------------

    def _autoregressive(self) -> None:
        while not self.done:
            if self.concurrent is not None:
                self.concurrent.catch_up(self.tokens, self.committed)
            else:
                for i in self.targets:
                    self.members[i].catch_up(self.tokens, self.committed)
            self.tokens.append(self._draw_target())
            self.commit(1)

    def _mixture(self, schedule: list[tuple[Proposer, int]] | None) -> None:
        """Per position: the member drawn by weight, fed what it missed, draws the token from its own ``p_k``;
        with a drafter, runs of positions drawn for another member are decoded speculatively."""
        drafter, gamma = schedule[0] if schedule else (None, 0)
        self.drawn: list[int] = []  # the member of each position from the prompt's end, drawn once
        while not self.done:
            k = self._member_at(self.committed)
            if drafter is None or k == drafter.index:
                self.tokens.append(self._draw_from(k, self.committed))
                self.commit(1)
                continue
            self._draft(drafter, gamma, allowed=lambda pos, k=k: self._member_at(pos) in (k, drafter.index))
            if self._verify_mixture(k) or self.done:
                continue
            if self._member_at(self.committed) == k and self.members[k].knows(self.committed):
                self.tokens.append(self._draw_from(k, self.committed))  # bonus token
                self.commit(1)

    def _member_at(self, pos: int) -> int:
        while len(self.drawn) <= pos - self.prompt_len:
            self.drawn.append(self.targets[int(sample(self.mixture, self.generator)[0])])
        return self.drawn[pos - self.prompt_len]

    def _own_rows(self, k: int, start: int, stop: int) -> Tensor:
        """Member ``k``'s own rows for positions ``[start, stop)``, fed what it missed first."""
        member = self.members[k]
        member.catch_up(self.tokens, self.committed)
        rows = member.span(start, stop)
        if self.audit is not None:
            self.audit.check(self.tokens, start, stop, [rows], [k], single_model, self.sampling)
        return rows

    def _draw_from(self, k: int, pos: int) -> int:
        """A token for ``pos`` drawn from member ``k``'s own distribution."""
        return int(sample(probs(self._own_rows(k, pos, pos + 1), self.sampling), self.generator)[0])

    def _verify_mixture(self, k: int) -> bool:
        """Member ``k`` verifies every pending token: ``p_k`` at its positions, the drafter's ``q`` at the
        drafter's own (accepted there). True on a rejection."""
        start, count = self.committed, len(self.tokens) - self.committed
        target = probs(self._own_rows(k, start, start + count), self.sampling)
        for j, p in enumerate(self.pending[:count]):
            if self._member_at(start + j) != k:
                target[j] = p.q
        return self._settle(start, count, target)

    def _speculative(self, schedule: list[tuple[Proposer, int]]) -> None:
        turn = 0
        self.gammas = [gamma for _, gamma in schedule]  # each turn's current gamma
        while not self.done:
            proposer, gamma = schedule[turn][0], self.gammas[turn]
            proposer.feed(self.tokens, self.committed)
            if self._verify():
                turn = 0  # a rejection restarts the schedule
                continue
            if self.done:
                break
            if self.committed == len(self.tokens) and all(self.members[i].knows(self.committed) for i in self.targets):
                self.tokens.append(self._draw_target())  # bonus token
                self.commit(1)
                if self.done:
                    break
            self._draft(proposer, gamma, turn)
            turn = (turn + 1) % len(schedule)

    def _draft(
        self, proposer: Proposer, gamma: int, turn: int = -1, allowed: Callable[[int], bool] | None = None
    ) -> None:
        """Append up to ``gamma`` proposals (fewer if the proposer runs out, proposes EOS, reaches a position
        it is not ``allowed`` to propose for, or its reach falls below what a drafted token costs); ``turn``: the
        schedule's turn that drafts them.

        The reach of a proposal is the product of the ``confidence`` of the turn's proposals up to it: the
        proposers' own estimate that the round keeps it (every one before it kept too). A proposal whose reach is
        below the method's ``least_reach`` (what one more verified position costs, in tokens) is not drafted, nor
        anything after it. A confidence is a function of the context and of rows already computed, never of the
        token drawn at its position (a sampled draft's is its distribution's largest probability, not the drawn
        token's): so whether a position is drafted never depends on what is drawn there nor on the draws that
        accept it, and every method stays exact."""
        budget = self.stopper.max_new_tokens - (len(self.tokens) - self.prompt_len)
        reach = 1.0
        for _ in range(min(gamma, budget)):
            if allowed is not None and not allowed(len(self.tokens)):
                break
            proposal = proposer.draft(self.tokens, self.committed)
            if proposal is None:
                break
            if proposal.confidence is not None:
                reach *= proposal.confidence
                if reach < self.least_reach:
                    break
            proposal.turn = turn
            self.tokens.append(proposal.token)
            self.pending.append(proposal)
            proposal.by.stats.proposed += 1
            if proposal.token in self.stopper.eos_ids:
                break

    def _verify(self) -> bool:
        """Verify the pending tokens every target model has seen; True on a rejection."""
        start = self.committed
        pending = len(self.tokens) - start
        seen = min(self.members[i].runner.length for i in self.targets) - start + 1
        count = min(pending, seen)
        if count <= 0:
            return False
        return self._settle(start, count, self._target(start, start + count))

    def _settle(self, start: int, count: int, target: Tensor) -> bool:
        """Accept or reject the first ``count`` pending tokens against ``target``; True on a rejection."""
        proposed = torch.tensor(self.tokens[start : start + count], device=self.device)
        pending = self.pending[:count]
        if self.audit is not None:
            self.audit.check_proposals(self.tokens, start, pending, self.sampling)
        clock = time.perf_counter()
        if self.sampling.greedy:
            accepted, fix = verify_greedy(target, proposed)
        else:
            accepted, fix = verify_sampled(target, proposed, [p.q for p in pending], self.generator)
        self.stats.accept_time_s += time.perf_counter() - clock
        self.stats.record_round(count, accepted)
        if self.mixture is None:  # the positions this round commits (a mixture's target is no one distribution)
            n = min(accepted + 1, count)
            self.stats.record_ceiling(None if self.sampling.greedy else target[:n], n)
        for j, p in enumerate(pending[: accepted + 1]):
            p.by.stats.verified += 1
            p.by.stats.accepted += j < accepted
        if self.dynamic is not None:
            self._adapt_gammas(pending[: accepted + 1], accepted, self.pending[count:] if fix is None else [])
        if fix is None:
            del self.pending[:count]
            self.commit(count)
            return False
        del self.tokens[start + accepted :]
        self.tokens.append(fix)
        self.pending.clear()
        clock = time.perf_counter()
        for m in self.members:
            m.rewind(start + accepted)
        self.stats.trim_time_s += time.perf_counter() - clock
        self.commit(accepted + 1)
        return True

    def _adapt_gammas(self, verified: list[Proposal], accepted: int, unverified: list[Proposal]) -> None:
        """Dynamic gamma: the turn of a rejected proposal drafts fewer next time; a turn whose proposals
        were all verified and accepted drafts more. ``verified[:accepted]`` were accepted."""
        rejected = verified[accepted].turn if accepted < len(verified) else None
        later = {p.turn for p in unverified}  # turns whose round is not fully verified yet
        for turn in dict.fromkeys(p.turn for p in verified):
            if turn in self.fixed_turns:
                continue
            if turn == rejected:
                self.gammas[turn] = self.dynamic.next(self.gammas[turn], False)
            elif turn not in later:
                self.gammas[turn] = self.dynamic.next(self.gammas[turn], True)
