"""The job's corpus: text a proposer may read beside the context, made and held by the job that uses it.

A corpus holds fixed documents (the target's own text the job has: the teacher's continuations and labelled
source chunks from the teacher-data cache, ``models.corpus``) and what the job's prompts leave once each is done:
its output (searched by ``suffix``) and the table a ``recycle`` proposer learned from the target's rows. A prompt's
view of it (``Corpus.view``) is refused once that prompt has left anything there, so no proposal is ever drawn
from a prompt's own earlier output (that would measure a cache, not a proposer); the corpus is never written to a
file, so no other cell or run can read it either.

Text is searched through suffix automata (``SuffixAutomaton``: every substring of its text is a path from the root,
and a state's strings share their end positions, so the occurrences of a match and of each token after it are
counted once, as the automaton grows).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from ..errors import ArgumentError

MAX_MATCH = 32  # the longest suffix of the context matched: longer matches predict no better, and cost more


class SuffixAutomaton:
    """A suffix automaton over one or more token sequences, grown a token at a time (Blumer et al. 1985).

    Documents are kept apart by a separator of their own (a negative id), so no match spans two of them and no
    separator is ever proposed. Each state counts the end positions of its strings (``count``) and keeps the latest
    (``latest``): the count of the state a transition ``c`` leads to is the number of occurrences of the match
    followed by ``c``. Growing is linear in the text: a token adds one state that ends where it ends (``end``; a
    clone ends nowhere of its own), and the counts, sums over the suffix-link tree, are made once when next read
    (``settle``), never by walking the link chain per token, which on repetitive text (a document of one token
    repeated, a model's own looping output) is as long as the text. An ``eager`` automaton (a generation's own
    text, read after every round) keeps its counts by that walk instead: a few steps a token on ordinary text.
    """

    __slots__ = ("_count", "_latest", "documents", "eager", "end", "last", "length", "link", "next", "settled", "size")

    def __init__(self, documents: Iterable[Sequence[int]] = (), eager: bool = False):
        self.next: list[dict[int, int]] = [{}]
        self.link: list[int] = [-1]
        self.length: list[int] = [0]
        self.end: list[int] = [-1]  # where the state's own token ends (-1: the root, a clone)
        self._count: list[int] = [0]
        self._latest: list[int] = [-1]
        self.settled = True  # the counts hold for the text as it stands
        self.eager = eager  # counts kept as each token comes (a text read after every few tokens: a generation's own)
        self.last = 0  # the state of the whole text so far
        self.size = 0  # tokens appended (separators included)
        self.documents = 0
        for doc in documents:
            self.add_document(doc)

    def add_document(self, tokens: Sequence[int]) -> None:
        """Append ``tokens`` as a document of its own (after a separator when the automaton holds text)."""
        if self.size:
            self.documents += 1
            self.extend(-self.documents)  # a separator of its own: nothing matches across it
        for t in tokens:
            self.extend(int(t))

    def extend(self, c: int) -> None:
        """Append one token (the online construction): amortized constant work, the counts left to ``settle``; an
        ``eager`` automaton keeps them by walking the new state's link chain (a generation's own text, read every
        round: a few steps on ordinary text, where a whole settle per round would cost its length)."""
        nxt, link, length = self.next, self.link, self.length
        cur = len(nxt)
        nxt.append({})
        length.append(length[self.last] + 1)
        link.append(0)
        self.end.append(self.size)
        if self.eager:
            self._count.append(0)
            self._latest.append(-1)
        p = self.last
        while p != -1 and c not in nxt[p]:
            nxt[p][c] = cur
            p = link[p]
        if p != -1:
            q = nxt[p][c]
            if length[p] + 1 == length[q]:
                link[cur] = q
            else:
                clone = len(nxt)
                nxt.append(dict(nxt[q]))
                length.append(length[p] + 1)
                link.append(link[q])
                self.end.append(-1)
                if self.eager:
                    self._count.append(self._count[q])
                    self._latest.append(self._latest[q])
                while p != -1 and nxt[p].get(c) == q:
                    nxt[p][c] = clone
                    p = link[p]
                link[q] = link[cur] = clone
        self.last = cur
        end = self.size
        self.size += 1
        if not self.eager:
            self.settled = False
            return
        v = cur
        while v > 0:  # every suffix of the text now ends here once more: short on ordinary text, read each round
            self._count[v] += 1
            self._latest[v] = end
            v = link[v]

    def settle(self) -> None:
        """Each state's count of end positions and its latest one, summed once over the suffix-link tree (children
        before parents: the states by decreasing length), in time linear in the text."""
        if self.settled:
            return
        length, link, end = self.length, self.link, self.end
        count = [int(e >= 0) for e in end]
        latest = list(end)
        by_length: list[list[int]] = [[] for _ in range(self.size + 1)]
        for v, n in enumerate(length):
            by_length[n].append(v)
        for n in range(self.size, 0, -1):
            for v in by_length[n]:
                parent = link[v]
                count[parent] += count[v]
                if latest[v] > latest[parent]:
                    latest[parent] = latest[v]
        self._count, self._latest, self.settled = count, latest, True

    @property
    def count(self) -> list[int]:
        """The number of end positions of each state's strings (its occurrences in the text)."""
        self.settle()
        return self._count

    @property
    def latest(self) -> list[int]:
        """The latest end position of each state's strings."""
        self.settle()
        return self._latest

    def match(self, context: Sequence[int], longest: int = MAX_MATCH) -> tuple[int, int]:
        """``(state, length)``: the longest suffix of ``context`` (at most ``longest`` tokens) that occurs in the
        text and is followed there by a token (a negative id in the context starts the match afresh)."""
        nxt, link, length = self.next, self.link, self.length
        v = n = 0
        for t in context[-longest:] if longest else ():
            if t < 0:
                v = n = 0
                continue
            while v and t not in nxt[v]:
                v = link[v]
                n = length[v]
            if t in nxt[v]:
                v, n = nxt[v][t], n + 1
        while v and not self._followed(v):
            v = link[v]
            n = length[v]
        return v, n

    def _followed(self, v: int) -> bool:
        return any(t >= 0 for t in self.next[v])

    def continuations(self, state: int) -> list[tuple[int, int, int]]:
        """``(token, count, latest end)`` of every token that follows the state's strings, the most frequent
        first (the most recent on a tie)."""
        count, latest = self.count, self.latest
        found = [(t, count[s], latest[s]) for t, s in self.next[state].items() if t >= 0]
        return sorted(found, key=lambda x: (-x[1], -x[2]))


class CorpusLeak(ArgumentError):
    """A prompt's view of the corpus was asked for once its own output was in it."""


class Corpus:
    """Text the suffix proposer may search beside the context: fixed documents (the target's own text the job
    holds) and the outputs of the job's prompts, each added once its prompt is done (``add_output``).

    ``view(prompt_id)`` is what a generation of that prompt searches; it is refused (``CorpusLeak``) once the prompt
    has an output here, so no proposal is ever copied from a prompt's own earlier output. The corpus is never
    written to a file: it is made by the job that uses it and ends with it.
    """

    def __init__(self, documents: Iterable[Sequence[int]] = (), source: str = ""):
        start = time.perf_counter()
        self.fixed = SuffixAutomaton(documents)
        self.outputs = SuffixAutomaton()
        self.done: set[str] = set()
        self.table: dict[int, list[int]] = {}  # recycled candidates after each token, from the done prompts
        self.pending: dict[str, dict[int, list[int]]] = {}  # a prompt's table, merged once the prompt is done
        self.source = source  # where the fixed documents came from, as messages and records name it
        self.build_s = time.perf_counter() - start

    @property
    def tokens(self) -> int:
        return self.fixed.size + self.outputs.size

    def left_by(self, prompt_id: str) -> dict[int, list[int]] | None:
        """What a prompt's generation left to the prompts after it beyond the recycled table as it stands (the rows
        its table changed; None: it left no table): what a journal line keeps, so that a resumed job rebuilds the
        same corpus (``add_output``'s ``left``)."""
        left = self.pending.get(str(prompt_id))
        return None if left is None else {t: ranked for t, ranked in left.items() if self.table.get(t) != ranked}

    def add_output(self, prompt_id: str, tokens: Sequence[int], left: dict[int, list[int]] | None = None) -> None:
        """The output of a prompt that is done (and the table its generation left, ``CorpusView.leave``, or on a
        resume ``left``, as ``left_by`` gave it): read by the views of every other prompt from now on."""
        prompt_id = str(prompt_id)
        if left is not None:
            self.pending[prompt_id] = left
        self.done.add(prompt_id)
        if tokens:
            self.outputs.add_document([t for t in tokens if t >= 0])
        self.table.update(self.pending.pop(prompt_id, {}))

    def view(self, prompt_id: str) -> CorpusView:
        if str(prompt_id) in self.done:
            raise CorpusLeak(
                f"the corpus holds an output of prompt {prompt_id!r} already: a generation of that prompt may not "
                "search it (its proposals would be copied from its own earlier output)"
            )
        return CorpusView(self, str(prompt_id))

    def describe(self) -> dict:
        return {
            "source": self.source,
            "fixed_tokens": self.fixed.size - self.fixed.documents,
            "fixed_documents": self.fixed.documents + (1 if self.fixed.size else 0),
            "outputs": len(self.done),
            "build_s": round(self.build_s, 4),
        }


@dataclass(frozen=True)
class CorpusView:
    """What one prompt's generation may search: the corpus as it stands, its own prompt's output never in it."""

    corpus: Corpus
    prompt_id: str

    def _check(self) -> None:
        if self.prompt_id in self.corpus.done:  # the corpus moved on past this prompt since the view was made
            raise CorpusLeak(f"the corpus took an output of prompt {self.prompt_id!r} while its view was in use")

    def automata(self) -> list[tuple[str, SuffixAutomaton]]:
        """The corpus's automata that hold text, by kind: ``outputs`` (the done prompts' outputs, the target's
        text on the job's own task), then ``fixed`` (the fixed documents)."""
        self._check()
        found = (("outputs", self.corpus.outputs), ("fixed", self.corpus.fixed))
        return [(kind, a) for kind, a in found if a.size]

    def table(self) -> dict[int, list[int]]:
        """A copy of the recycled candidates the done prompts' generations left."""
        self._check()
        return dict(self.corpus.table)

    def leave(self, table: dict[int, list[int]]) -> None:
        """This prompt's recycled table, taken into the corpus when the prompt is done (the last one left)."""
        self.corpus.pending[self.prompt_id] = dict(table)
