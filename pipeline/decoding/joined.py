"""Decoding over a union vocabulary: the decoder's loops, unchanged, over members seen through ``U``.

The decoder's token list holds union ids (``union.py``). Each member's runner
is wrapped in a ``UnionRunner``: fed union tokens, it feeds the model its own
encoding of each (all in one forward; its own encoding of the prompt's text
first), crops its cache at union-token boundaries, and returns one row per
union token: the model's row at the end of that token's encoding as ``log P_m``
over ``U`` (``Joined.to_union``: warped in the model's own vocabulary).

Since ``softmax(log P) = P`` and ``warp`` at temperature 1 without top-k or
top-p is the identity, the decoder runs at those settings
(``Sampling.identity()``; greedy stays greedy, its members' rows unwarped as
always), and every loop, ensemble function, proposer and the one acceptance
rule see a distribution over ``U`` where they saw one over a shared
vocabulary: ``we``, ``gac`` and their speculative and mixture forms are the
union ensembles of ``docs/algorithms.md`` with no second code path.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from ..errors import ArgumentError
from .audit import Audit
from .checks import head_rows
from .runner import Runner
from .sampling import Sampling, probs
from .spec import MethodSpec
from .stats import GenerationStats, ModelStats
from .union import MemberMap, UnionVocab, check_joinable, check_present, same_vocabulary


def join(models: Sequence[torch.nn.Module], tokenizers: Any, spec: MethodSpec, names: list[str]) -> UnionVocab | None:
    """The union of the models' tokenizers, or None when they are one tokenizer (today's path); refuses in one
    line a method that cannot run over a union."""
    if not isinstance(tokenizers, (list, tuple)) or len(tokenizers) != len(models):
        count = len(tokenizers) if isinstance(tokenizers, (list, tuple)) else type(tokenizers).__name__
        raise ArgumentError(f"tokenizers: expected a list of {len(models)} tokenizers, one per model; got {count}")
    check_present(tokenizers, names)
    for i, (model, tokenizer) in enumerate(zip(models, tokenizers)):  # each tokenizer belongs to its model
        rows = head_rows(model)
        if len(tokenizer) > rows:
            raise ArgumentError(
                f"tokenizers[{i}] has {len(tokenizer)} tokens but model {names[i]} scores {rows}: each tokenizer "
                "must be its own model's, in the models' order"
            )
    if same_vocabulary(tokenizers):
        return None
    union = check_joinable(tokenizers, names)
    if why := one_tokenizer_problem(spec):
        raise ArgumentError(
            f"{spec.name!r} needs one shared tokenizer but these models tokenize differently ({why}); the other "
            "methods run over the union of their vocabularies"
        )
    return union


def one_tokenizer_problem(spec) -> str | None:
    """Why a method cannot run over a set of different tokenizers (None: it can, over their union), in the words
    ``generate``, the config check and the preflight all say it."""
    if spec.ensemble is not None and spec.ensemble.full_vocab:
        return "contrastive decoding needs the amateur to score every token of the expert's vocabulary"
    if not spec.engine.unions:
        return f"{spec.engine.title} runs one shared tokenizer"
    return None


class Joined:
    """A generation over a union: its prompt in union ids, every member's own prompt, the warp each member
    applies in its own vocabulary, and the time spent mapping rows into ``U`` (``stats.union_map_s``)."""

    def __init__(self, union: UnionVocab, prompt: list[int], sampling: Sampling, stats: GenerationStats):
        self.union, self.stats = union, stats
        self.warp = Sampling.identity() if sampling.greedy else sampling
        self.sampling = sampling if sampling.greedy else Sampling.identity()  # what the decoder runs at
        first = union.members[0]
        index = first.union_ids
        # the prompt's tokens outside U (its specials) stay distinct but are never a union id (prompt lookup
        # proposes none of them)
        self.prompt = [index[t] if t < len(index) and index[t] < union.size else -1 - t for t in prompt]
        text = first.tokenizer.decode(prompt, skip_special_tokens=True)
        self.own_prompts = [list(prompt)] + [self._encode(m, text) for m in union.members[1:]]
        stats.union_size = union.size

    def _encode(self, member: MemberMap, text: str) -> list[int]:
        """A member's own encoding of the prompt's text (its special tokens included), refused in one line
        unless its regular tokens spell that text (a SentencePiece tokenizer's leading space allowed)."""
        ids = list(member.tokenizer.encode(text))
        size, index = self.union.size, member.union_ids
        spelled = b"".join(self.union.strings[index[i]] for i in ids if i < len(index) and index[i] < size)
        if spelled not in (text.encode(), b" " + text.encode()):
            raise ArgumentError(
                f"{member.name}'s tokenizer encodes the prompt's text {text[:40]!r} as "
                f"{spelled[:40].decode('utf-8', errors='replace')!r} (unknown or normalised characters); "
                "it cannot share this prompt"
            )
        return ids

    def eos(self, ids: set[int]) -> set[int]:
        """The first model's EOS ids as union ids (specials outside ``U`` can never be emitted: dropped)."""
        index = self.union.members[0].union_ids
        return {index[i] for i in ids if i < len(index) and index[i] < self.union.size}

    def runner(self, i: int, inner: Runner) -> UnionRunner:
        return UnionRunner(inner, i, self)

    def max_len(self, i: int, new_tokens: int) -> int:
        """The most of its own tokens member ``i`` is fed in one generation."""
        return len(self.own_prompts[i]) + (new_tokens + 1) * self.union.members[i].longest

    def to_union(self, member: MemberMap, logits: Tensor) -> Tensor:
        """``log P_m`` over ``U`` from a member's logits rows ``[k, V_m]``: mask, warp, scatter-add, log."""
        start = time.perf_counter()
        index, outside = member.device_maps(logits.shape[-1], self.union.size, logits.device)
        p = probs(logits.masked_fill(outside, float("-inf")), self.warp)
        out = torch.zeros((p.shape[0], self.union.size + 1), dtype=p.dtype, device=p.device)
        out.index_add_(1, index, p)
        rows = out[:, : self.union.size].log()
        self.stats.union_map_s += time.perf_counter() - start
        return rows

    def audit(self, audit: Audit) -> UnionAudit:
        return UnionAudit(audit, self)

    def pieces(self, token_ids: list[int]) -> list[str]:
        return [self.union.piece(u) for u in token_ids]


class UnionRunner:
    """A member's runner fed union tokens (see the module docstring); ``length`` counts union tokens."""

    def __init__(self, inner: Runner | None, i: int, joined: Joined):
        self.inner, self.joined, self.member = inner, joined, joined.union.members[i]
        self.own_prompt, self.prompt_len = joined.own_prompts[i], len(joined.prompt)
        self.vocab_size = joined.union.size
        self.length = 0
        self.ends: list[int] = []  # [i]: the member's own length once union token i is fed

    @property
    def stats(self) -> ModelStats:
        return self.inner.stats

    @property
    def device(self) -> torch.device:
        """The model's device (``parallel.py`` gives a CUDA member its own stream)."""
        return getattr(self.inner, "device", torch.device("cpu"))

    def own_tokens(self, tokens: list[int]) -> tuple[list[int], list[int]]:
        """The member's own tokens for union ``tokens`` (the prompt's positions first) and, per union position,
        its own length once that position is fed (the prompt's positions all end with the own prompt)."""
        own = list(self.own_prompt)
        ends = [len(own)] * min(len(tokens), self.prompt_len)
        for u in tokens[self.prompt_len :]:
            own += self.member.encodings[u]
            ends.append(len(own))
        return own, ends

    def extend(self, tokens: list[int], keep: int) -> Tensor:
        start, end = self.length, self.length + len(tokens)
        if start == 0:
            own, self.ends = self.own_tokens(tokens)
        else:
            own = [t for u in tokens for t in self.member.encodings[u]]
            base = self.ends[-1]
            for u in tokens:
                base += len(self.member.encodings[u])
                self.ends.append(base)
        wanted = [self.ends[j] - 1 for j in range(end - keep, end)]  # own position of each row's last token
        first = wanted[0]
        logits = self.inner.extend(own, self.ends[end - 1] - first)
        self.length = end
        return self.joined.to_union(self.member, logits[[w - first for w in wanted]])

    def crop(self, length: int) -> None:
        if length < self.length:
            self.inner.crop(self.ends[length - 1])
            del self.ends[length:]
            self.length = length


class UnionAudit(Audit):
    """The audit over a union: each member's rows recomputed from one forward of its own whole context (its
    prompt and its encodings of the union tokens), mapped into ``U`` as the decoder maps them."""

    def __init__(self, base: Audit, joined: Joined):
        self.base, self.joined = base, joined
        self.models, self.tolerance = base.models, base.tolerance
        self._own: dict[int, tuple[tuple[int, ...], Tensor, list[int]]] = {}

    def _compare(self, got: Tensor, want: Tensor, what: str) -> None:  # counted in the base audit
        self.base._compare(got, want, what)

    def _rows(self, index: int, tokens: list[int], start: int, stop: int) -> Tensor:
        context, logits, ends = self._own.get(index, ((), None, []))
        if len(context) < stop - 1 or context[: stop - 1] != tuple(tokens[: stop - 1]):
            own, ends = UnionRunner(None, index, self.joined).own_tokens(tokens)
            model = self.models[index]
            ids = torch.tensor([own], device=next(model.parameters()).device)
            context, logits = tuple(tokens), model(input_ids=ids, use_cache=False).logits[0].double()
            self._own[index] = context, logits, ends
        rows = logits[[ends[pos - 1] - 1 for pos in range(start, stop)]]
        return self.joined.to_union(self.joined.union.members[index], rows)
