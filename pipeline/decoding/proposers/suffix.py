"""The suffix proposer ``suffix``: continuations of the context's longest suffix found in text the target has seen
or made, for no forward at all (SAM-Decoding, Hu et al. 2024; SuffixDecoding, Oliaro et al. 2024).

Two kinds of text are searched, each through a suffix automaton (``corpus.SuffixAutomaton``):

* the generation's own context: the prompt and the tokens committed so far, taken in as they become final;
* the job's corpus (``corpus.Corpus``, one prompt's view of it): the target's own text the job holds and the
  outputs of the job's other prompts, never the prompt's own.

The proposal is the most frequent token after the longest match (the context's own on a tie); a token tree takes
several, ranked by count. A source proposes only from a match of 2 tokens or more (6 in the corpus's fixed
documents, text of another kind than the task's) whose most frequent continuation holds 3/4 of them: measured on
the bundled model's greedy HumanEval answers, such a proposal is the target's token 54-97% of the time, where
shorter or less one-sided matches are right 4-30% of the time (docs/proposers.md). A chain drafts on while that
holds, within the turn's gamma: the match sets how far. A proposal is a deterministic function of the context and
the corpus, so it is one-hot and the shared acceptance rule keeps every method exact; it costs a few dictionary
lookups per matched token.
"""

from __future__ import annotations

import time

from ...errors import ArgumentError
from ..corpus import CorpusView, SuffixAutomaton
from ..stats import ModelStats
from .base import NamedProposer, Proposal, ProposerSetup, ProposerTests, register_proposer


# the suites chain it before recycle: suffix abstains where its match is short or split, recycle proposes there
@register_proposer("suffix", test_args=ProposerTests(chain=("recycle",)))
class SuffixProposer(NamedProposer):
    """The longest suffix of the context found in the context itself or in the corpus; the most frequent token
    after it, where the match is long enough and that token frequent enough (``continuations``): so the match
    sets how far a chain drafts (within the turn's gamma), and below it the turn's next proposer, or none,
    drafts."""

    branches = True  # several continuations, ranked by count
    reads_corpus = True  # the job's corpus beside the context

    def __init__(
        self,
        corpus: CorpusView | None = None,
        min_match: int = 2,
        min_share: float = 0.75,
        fixed_match: int = 6,
    ):
        if min_match < 1 or fixed_match < 1 or not 0.0 <= min_share <= 1.0:
            raise ArgumentError(
                f"suffix min_match={min_match!r}, fixed_match={fixed_match!r}, min_share={min_share!r}: expected "
                "matches of 1 token or more and a share in 0..1"
            )
        self.corpus, self.min_share = corpus, min_share
        self.least = {"own": min_match, "outputs": min_match, "fixed": fixed_match}
        self.own = SuffixAutomaton(eager=True)  # read every round: its counts kept as tokens come
        self.stats = ModelStats()

    @classmethod
    def for_decoder(cls, setup: ProposerSetup) -> SuffixProposer:
        return cls(setup.corpus)

    def feed(self, tokens: list[int], committed: int) -> None:
        """Take in the tokens that became final (the own automaton holds exactly ``tokens[:committed]``)."""
        own = self.own
        if own.size < committed:
            start = time.perf_counter()
            for t in tokens[own.size : committed]:
                own.extend(t if t >= 0 else -1)  # a prompt token no proposal names (joined.py): never followed
            self.stats.propose_time_s += time.perf_counter() - start

    def draft(self, tokens: list[int], committed: int) -> Proposal | None:
        self.feed(tokens, committed)
        found = self.ranked(tokens)
        if not found:
            return None
        token, share = found[0]
        return Proposal(token, None, self, confidence=share)

    def continuations(self, context: list[int], limit: int) -> list[int]:
        return [token for token, _ in self.ranked(context)[:limit]]

    def ranked(self, context: list[int]) -> list[tuple[int, float]]:
        """Up to ``limit`` distinct tokens after the context's longest match: the longer match's source first
        (on a tie: the context's own text, then the done prompts' outputs, then the fixed documents), each source's
        most frequent first. A source drafts only from a match of its least length (``min_match``; the fixed
        documents, text of another kind than the task's, ``fixed_match``) whose most frequent continuation holds
        ``min_share`` of them: its first candidate is the run's confidence; the rest, for a token tree, need only
        have followed it. The context's own text is what ``feed`` took in (its final tokens); the rest of
        ``context`` is matched, never learned."""
        start = time.perf_counter()
        sources = [("own", self.own), *(self.corpus.automata() if self.corpus is not None else [])]
        matches = []
        for rank, (kind, automaton) in enumerate(sources):
            state, length = automaton.match(context)
            if length < self.least[kind]:
                continue
            following = automaton.continuations(state)
            if following[0][1] >= self.min_share * sum(count for _, count, _ in following):
                matches.append((-length, rank, following))
        found: dict[int, float] = {}
        for _, _, following in sorted(matches, key=lambda m: m[:2]):
            total = sum(count for _, count, _ in following)
            for token, count, _ in following:
                found.setdefault(token, count / total)
        self.stats.propose_time_s += time.perf_counter() - start
        return list(found.items())
