"""The union vocabulary of models with different tokenizers, and each member's maps into it.

Every regular token of a member stands for a string of bytes (``Convention.token_bytes``: a byte-level BPE's
characters for bytes, SentencePiece's ``▁`` for a space and ``<0xNN>`` byte-fallback tokens, else UTF-8 text);
special tokens are left out, except each member's EOS, which stands for one shared end symbol (``END``, the empty
string). The union vocabulary ``U`` is the set of those strings over all members (``docs/algorithms.md``,
"Members with different tokenizers").

Per member (``MemberMap``), built once per set of tokenizers and cached by their hashes: ``index``, its ids to
union ids (ids outside ``U`` go to one extra column that is dropped), so a distribution over its own vocabulary
becomes one over ``U`` by one scatter-add; and ``encodings``, its own tokens for every union string: the token
that stands for those bytes (where several do, the one that is not a byte-fallback token, then the lowest id),
else the fewest of its tokens that spell them (``split``: a deterministic rule on bytes). A member that cannot
spell some string is refused when the set is built (``check_joinable``).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property, lru_cache
from typing import Any

import torch
from torch import Tensor

from ..errors import UserError

END = b""  # the shared end symbol: every member's EOS (no regular token stands for the empty string)
_BYTE_FALLBACK = re.compile(r"<0x([0-9A-Fa-f]{2})>")


class JoinError(UserError):
    """A set of tokenizers that cannot be joined into one union vocabulary (one line)."""


@lru_cache(maxsize=1)
def byte_level_table() -> dict[str, int]:
    """Byte-level BPE's characters to the bytes they stand for: printable bytes are their own character,
    every other byte ``b`` is the character ``256 + n`` where it is the ``n``-th such byte."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table = {chr(b): b for b in printable}
    others = [b for b in range(256) if b not in set(printable)]
    table.update({chr(256 + n): b for n, b in enumerate(others)})
    return table


@dataclass(frozen=True)
class Convention:
    """How a tokenizer writes bytes in its tokens."""

    byte_level: bool  # GPT-2 style: each character stands for one byte
    metaspace: bool  # SentencePiece style: "▁" is a space
    byte_fallback: bool  # "<0xNN>" tokens stand for one byte

    def token_bytes(self, token: str) -> bytes:
        if self.byte_level:
            table = byte_level_table()
            if all(c in table for c in token):
                return bytes(table[c] for c in token)
            return token.encode()
        if self.byte_fallback and (m := _BYTE_FALLBACK.fullmatch(token)):
            return bytes([int(m.group(1), 16)])
        return (token.replace("▁", " ") if self.metaspace else token).encode()


def _backend(tokenizer: Any, name: str) -> Any:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        raise JoinError(
            f"{name}: its tokenizer ({type(tokenizer).__name__}) is not a fast (Rust) tokenizer; "
            "joining vocabularies needs one (AutoTokenizer.from_pretrained(..., use_fast=True))"
        )
    return backend


def convention(tokenizer: Any, name: str) -> Convention:
    spec = json.loads(_backend(tokenizer, name).to_str())
    model = spec.get("model") or {}
    if model.get("type") == "WordPiece":
        raise JoinError(f"{name}: a WordPiece tokenizer ('##' continuations) cannot be joined; accepted: BPE, Unigram")
    around = json.dumps([spec.get("pre_tokenizer"), spec.get("decoder")], ensure_ascii=False)
    return Convention(
        byte_level='"ByteLevel"' in around,
        metaspace="▁" in around,
        byte_fallback=bool(model.get("byte_fallback")) or '"ByteFallback"' in around,
    )


def tokenizer_hash(tokenizer: Any, name: str = "a model") -> str:
    """A hash of everything the union reads from a tokenizer (kept on the tokenizer once computed)."""
    cached = getattr(tokenizer, "_specens_union_hash", None)
    if cached is not None:
        return cached
    text = _backend(tokenizer, name).to_str()
    extra = json.dumps([getattr(tokenizer, "eos_token_id", None), sorted(getattr(tokenizer, "all_special_ids", []))])
    digest = hashlib.sha256((text + extra).encode()).hexdigest()
    with contextlib.suppress(AttributeError):  # an object without attributes: hashed again next time
        tokenizer._specens_union_hash = digest
    return digest


def token_table(tokenizer: Any, name: str) -> tuple[dict[int, bytes], int | None, Convention]:
    """A tokenizer's regular tokens as bytes (id -> bytes), its EOS id and its convention."""
    conv = convention(tokenizer, name)
    backend = _backend(tokenizer, name)
    added = backend.get_added_tokens_decoder()
    special = {i for i, t in added.items() if t.special} | set(getattr(tokenizer, "all_special_ids", []))
    eos = getattr(tokenizer, "eos_token_id", None)
    table = {}
    for token, i in backend.get_vocab(with_added_tokens=True).items():
        if i in special:
            continue
        raw = added[i].content.encode() if i in added else conv.token_bytes(token)
        if raw:  # a token for the empty string could never be fed to another member
            table[i] = raw
    return table, eos, conv


def split(data: bytes, own: dict[bytes, int], longest: int) -> tuple[int, ...] | None:
    """The fewest tokens of ``own`` (bytes -> id) whose bytes concatenate to ``data``, ties broken by the
    longest first token, then the longest next; None when there is no such split."""
    n = len(data)
    best: list[tuple[int, tuple[int, ...]] | None] = [None] * (n + 1)
    best[n] = (0, ())
    for i in range(n - 1, -1, -1):
        for j in range(min(n, i + longest), i, -1):  # longest piece first: a tie keeps the first found
            tail = best[j]
            if tail is None or (token := own.get(data[i:j])) is None:
                continue
            if best[i] is None or tail[0] + 1 < best[i][0]:
                best[i] = (tail[0] + 1, (token, *tail[1]))
    return None if best[0] is None else best[0][1]


def _show(data: bytes) -> str:
    return repr(data.decode("utf-8", errors="backslashreplace"))


@dataclass
class MemberMap:
    """One member's maps: its ids to union ids (``index``) and union ids to its own tokens (``encodings``)."""

    name: str
    tokenizer: Any
    index: Tensor  # [tokenizer size] long; the union's size (a dropped column) for ids outside U
    encodings: list[tuple[int, ...]]
    eos: int | None
    longest: int  # the most own tokens one union token's encoding holds
    _on: dict[tuple[str, int], tuple[Tensor, Tensor]] = field(default_factory=dict, repr=False)

    @cached_property
    def union_ids(self) -> list[int]:
        """``index`` as a list (read per generation for the prompt and the EOS ids)."""
        return self.index.tolist()

    def device_maps(self, rows: int, size: int, device: torch.device) -> tuple[Tensor, Tensor]:
        """For a model with ``rows`` output rows: the index into ``U`` (plus the dropped column) and the mask of
        ids outside ``U``, on ``device`` (made once)."""
        key = (str(device), rows)
        if key not in self._on:
            index = torch.full((rows,), size, dtype=torch.long)
            common = min(rows, self.index.shape[0])
            index[:common] = self.index[:common]
            self._on[key] = index.to(device), (index == size).to(device)
        return self._on[key]


class UnionVocab:
    """The union vocabulary of a set of tokenizers (``strings``: the union's byte strings, ``END`` among them
    where a member has an EOS) and one ``MemberMap`` per member, in the set's order."""

    def __init__(self, tokenizers: Sequence[Any], names: Sequence[str]):
        tables = [token_table(t, n) for t, n in zip(tokenizers, names)]
        strings: dict[bytes, int] = {}
        with_eos = [n for n, (_, eos, _) in zip(names, tables) if eos is not None]
        if with_eos and len(with_eos) < len(names):
            lacking = next(n for n, (_, eos, _) in zip(names, tables) if eos is None)
            raise JoinError(f"{lacking}: its tokenizer has no EOS token, {with_eos[0]}'s has; every member needs one")
        for table, eos, _ in tables:
            if eos is not None:
                strings.setdefault(END, len(strings))
            for i in sorted(table):  # in id order: union ids do not depend on a dict's order
                strings.setdefault(table[i], len(strings))
        self.strings = list(strings)
        self.ids = strings
        self.size = len(strings)
        self.end = strings.get(END)
        self.members = [self._member(t, n, *table) for t, n, table in zip(tokenizers, names, tables)]

    def _member(self, tokenizer: Any, name: str, table: dict[int, bytes], eos: int | None, conv: Convention):
        size = max([*table, eos if eos is not None else -1, len(tokenizer) - 1]) + 1
        index = torch.full((size,), self.size, dtype=torch.long)
        own: dict[bytes, int] = {}
        spelled = tokenizer.convert_ids_to_tokens(sorted(table)) if conv.byte_fallback else []
        fallback = {i for i, token in zip(sorted(table), spelled) if _BYTE_FALLBACK.fullmatch(token)}
        for i in sorted(table, key=lambda i: (i in fallback, i)):
            index[i] = self.ids[table[i]]
            own.setdefault(table[i], i)
        if eos is not None:
            index[eos] = self.end
        longest = max(map(len, own), default=1)
        encodings = []
        for raw in self.strings:
            if raw == END:
                encodings.append((eos,))
                continue
            pieces = (own[raw],) if raw in own else split(raw, own, longest)
            if pieces is None:
                missing = next((bytes([b]) for b in raw if split(bytes([b]), own, longest) is None), raw)
                raise JoinError(
                    f"{name} cannot encode the bytes {_show(raw)} of another member's token: its tokenizer has "
                    f"no token sequence for {_show(missing)} (no byte fallback); these tokenizers cannot be joined"
                )
            encodings.append(pieces)
        return MemberMap(name, tokenizer, index, encodings, eos, max(map(len, encodings), default=1))

    def piece(self, union_id: int) -> str:
        """A union token as text (the end symbol as the first member's EOS token; bytes that are not valid
        UTF-8 as U+FFFD)."""
        if union_id == self.end:
            return str(getattr(self.members[0].tokenizer, "eos_token", "") or "")
        return self.strings[union_id].decode("utf-8", errors="replace")

    def text(self, union_ids: Sequence[int]) -> str:
        """The text of a sequence of union tokens (the end symbol writes nothing)."""
        return b"".join(self.strings[u] for u in union_ids if u >= 0).decode("utf-8", errors="replace")


_CACHE: dict[tuple[str, ...], UnionVocab] = {}


def check_present(tokenizers: Sequence[Any], names: Sequence[str] | None = None) -> tuple[list, list[str]]:
    """One tokenizer per member, none missing (``JoinError`` naming the member otherwise)."""
    tokenizers = list(tokenizers)
    names = list(names) if names is not None else [f"model {i}" for i in range(len(tokenizers))]
    if len(names) != len(tokenizers):
        raise JoinError(f"{len(tokenizers)} tokenizers for {len(names)} members ({', '.join(names)}): give one each")
    for name, tok in zip(names, tokenizers):
        if tok is None:
            raise JoinError(f"{name} has no tokenizer; models with different vocabularies need one each")
    return tokenizers, names


def check_joinable(tokenizers: Sequence[Any], names: Sequence[str] | None = None) -> UnionVocab:
    """The union vocabulary of ``tokenizers`` (one per model, in the set's order; ``names`` say how an error
    names each member); raises ``JoinError`` (a one-line ``UserError``) naming the member and why the set
    cannot be joined: a missing or unsupported tokenizer, a string of bytes a member cannot encode, an EOS
    missing from some. Built once per set of tokenizers (cached by their hashes)."""
    tokenizers, names = check_present(tokenizers, names)
    key = tuple(tokenizer_hash(t, n) for t, n in zip(tokenizers, names))
    if key not in _CACHE:
        _CACHE[key] = UnionVocab(tokenizers, names)
    union = _CACHE[key]
    if union.members[0].tokenizer is not tokenizers[0]:  # same content, other objects: rebind for text
        union = _rebind(union, tokenizers)
    return union


def _rebind(union: UnionVocab, tokenizers: Sequence[Any]) -> UnionVocab:
    out = object.__new__(UnionVocab)
    out.__dict__.update(union.__dict__)
    out.members = [
        MemberMap(m.name, t, m.index, m.encodings, m.eos, m.longest, m._on) for m, t in zip(union.members, tokenizers)
    ]
    return out


def same_vocabulary(tokenizers: Sequence[Any]) -> bool:
    """Whether every tokenizer is the same (by hash): such a set needs no union. Slow (Python) tokenizers, which
    a union cannot read, are the same when their class, vocabulary and special tokens are."""
    if all(t is tokenizers[0] for t in tokenizers):
        return True
    if any(getattr(t, "backend_tokenizer", None) is None for t in tokenizers):
        return len({_slow_key(t) for t in tokenizers}) == 1
    return len({tokenizer_hash(t, f"model {i}") for i, t in enumerate(tokenizers)}) == 1


def _slow_key(tokenizer: Any) -> str:
    """What tells a slow tokenizer apart: its class, vocabulary (with added tokens), EOS and special ids."""
    vocab = tokenizer.get_vocab() if callable(getattr(tokenizer, "get_vocab", None)) else None
    special = sorted(getattr(tokenizer, "all_special_ids", []))
    parts = [type(tokenizer).__qualname__, sorted((vocab or {}).items()), getattr(tokenizer, "eos_token_id", None)]
    return json.dumps([*parts, special], default=str)
