"""Prompt lookup: proposals copied from the context, no model needed.

The token that followed the latest earlier match of the context's last ``n``
tokens is proposed (``n`` from ``max_ngram`` down): a deterministic function of
the context, so its proposal distribution is one-hot and the shared acceptance
rule keeps it lossless.
"""

from __future__ import annotations

import time
from array import array

from ...errors import ArgumentError
from ..stats import ModelStats
from .base import NamedProposer, Proposal, register_proposer


@register_proposer("lookup")
class PromptLookup(NamedProposer):
    branches = True  # several continuations (``continuations``): a token tree's lookup branches

    def __init__(self, max_ngram: int = 4, min_ngram: int = 2):
        if not 1 <= min_ngram <= max_ngram:
            raise ArgumentError(f"lookup n-gram range {min_ngram}..{max_ngram} is empty")
        self.max_ngram, self.min_ngram = max_ngram, min_ngram
        self.stats = ModelStats()

    def draft(self, tokens: list[int], committed: int) -> Proposal | None:
        token = self.propose(tokens)
        if token is None or token < 0:  # a negative id marks a prompt token no proposal may name (joined.py)
            return None
        return Proposal(token, None, self)  # one-hot

    def propose(self, tokens: list[int]) -> int | None:
        """The token that followed the latest earlier match of the context's tail, or None."""
        found = self.continuations(tokens, 1)
        return found[0] if found else None

    def continuations(self, tokens: list[int], limit: int) -> list[int]:
        """Up to ``limit`` distinct tokens that followed earlier matches of the context's tail: longer n-grams
        first, later matches first (a token tree's lookup branches; the first is ``propose``'s)."""
        start = time.perf_counter()
        size = array("i").itemsize
        buf = array("i", tokens).tobytes()
        found: list[int] = []
        for n in range(min(self.max_ngram, len(tokens) - 1), self.min_ngram - 1, -1):
            pattern = buf[-n * size :]
            end = len(buf) - size  # a match must end before the last token: something follows it
            while len(found) < limit and (at := buf.rfind(pattern, 0, end)) >= 0:
                if at % size == 0 and (token := tokens[at // size + n]) not in found:
                    found.append(token)
                end = at + len(pattern) - 1
        self.stats.propose_time_s += time.perf_counter() - start
        return found
