"""Token Recycling, ``recycle`` (Luo et al. 2024, "Turning Trash into Treasure: Accelerating Inference of Large
Language Models with Token Recycling"): the target's own verification rows, which rank every token at every
verified position and are otherwise thrown away, kept as a small table.

Per token ``x``, the table holds the ``top`` tokens the target ranked highest at the latest verified position that
followed ``x`` (the rows the verification computed anyway, read before anything is accepted: ``observe``). The
proposal after a context ending in ``x`` is the table's first candidate for ``x``; a token tree takes the first
few (a static tree from the table: each node's children are its token's candidates). The table starts from what
the job's earlier prompts left (``corpus.CorpusView.table``; never the prompt's own) and is left to the job when
the generation ends. A proposal is a deterministic function of the context and the rows seen, so it is one-hot
and the shared acceptance rule keeps every method exact; it costs a dictionary lookup, and each verification one
``topk`` over its rows.
"""

from __future__ import annotations

import time

from torch import Tensor

from ..corpus import CorpusView
from ..stats import ModelStats
from .base import NamedProposer, Proposal, ProposerSetup, register_proposer

TOP = 8  # candidates kept per token: the widest node of a tree the default shapes draw


@register_proposer("recycle")
class TokenRecycling(NamedProposer):
    branches = True  # several candidates per token: a token tree from the table
    watches = True  # the target's verified rows fill the table
    reads_corpus = True  # starts from the table the job's earlier prompts left

    def __init__(self, corpus: CorpusView | None = None, top: int = TOP):
        self.corpus, self.top = corpus, top
        self.table: dict[int, list[int]] = corpus.table() if corpus is not None else {}
        # the target's probability of each token's first candidate where this generation saw it (its confidence;
        # none for a row the job's earlier prompts left)
        self.sure: dict[int, float] = {}
        self.stats = ModelStats()

    @classmethod
    def for_decoder(cls, setup: ProposerSetup) -> TokenRecycling:
        return cls(setup.corpus)

    def observe(self, before: list[int], rows: Tensor) -> None:
        start = time.perf_counter()
        top = rows.topk(min(self.top, rows.shape[-1]), dim=-1)
        for token, ranked, first in zip(before, top.indices.tolist(), top.values[:, 0].tolist()):
            if token >= 0:  # a prompt token no proposal names (joined.py) is followed by nothing here
                self.table[token] = ranked
                self.sure[token] = first
        self.stats.propose_time_s += time.perf_counter() - start

    def draft(self, tokens: list[int], committed: int) -> Proposal | None:
        found = self.continuations(tokens, 1)
        if not found:
            return None
        return Proposal(found[0], None, self, confidence=self.sure.get(tokens[-1]))

    def continuations(self, context: list[int], limit: int) -> list[int]:
        start = time.perf_counter()
        found = self.table.get(context[-1], [])[:limit] if context else []
        self.stats.propose_time_s += time.perf_counter() - start
        return found

    def close(self) -> None:
        if self.corpus is not None:
            self.corpus.leave(self.table)
