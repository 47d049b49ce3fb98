"""Tiny tokenizers of two conventions, built with the ``tokenizers`` library, and tiny models for them."""

from __future__ import annotations

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast


def byte_level(vocab: list[str], merges: list[tuple[str, str]]) -> PreTrainedTokenizerFast:
    """A GPT-2 style byte-level BPE: id 0 is its EOS ``<|endoftext|>``, then ``vocab`` (byte-level characters:
    ``Ġ`` a space, ``Ċ`` a newline)."""
    ids = {tok: i for i, tok in enumerate(["<|endoftext|>", *vocab])}
    tok = Tokenizer(models.BPE(vocab=ids, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken("<|endoftext|>", special=True)])
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>")


def sentencepiece(vocab: list[str], merges: list[tuple[str, str]], byte_fallback: bool = True):
    """A SentencePiece-style BPE: ``<unk>``, ``<s>``, ``</s>`` (its EOS), then ``vocab`` (``▁`` a space,
    ``<0xNN>`` byte-fallback tokens)."""
    ids = {tok: i for i, tok in enumerate(["<unk>", "<s>", "</s>", *vocab])}
    model = models.BPE(vocab=ids, merges=merges, unk_token="<unk>", byte_fallback=byte_fallback)
    tok = Tokenizer(model)
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    parts = [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    tok.decoder = decoders.Sequence(parts)
    tok.add_special_tokens([AddedToken(t, special=True) for t in ("<unk>", "<s>", "</s>")])
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="</s>", bos_token="<s>", unk_token="<unk>")


def gpt_style() -> PreTrainedTokenizerFast:
    """a b c, a space, a newline, and the merges ab, " a", bc."""
    return byte_level(["a", "b", "c", "Ġ", "Ċ", "ab", "Ġa", "bc"], [("a", "b"), ("Ġ", "a"), ("b", "c")])


def sp_style() -> PreTrainedTokenizerFast:
    """a b c, "▁" a space, a newline only as a byte (<0x0A>), "a" twice (also <0x61>), merges " a" and ba."""
    vocab = ["<0x0A>", "<0x61>", "a", "b", "c", "▁", "▁a", "ba"]
    return sentencepiece(vocab, [("▁", "a"), ("b", "a")])


def gpt_style_other() -> PreTrainedTokenizerFast:
    """Another byte-level BPE: other merges (ca, " b", "  "), no newline token of its own but its byte."""
    return byte_level(["a", "b", "c", "Ġ", "Ċ", "ca", "Ġb", "ĠĠ"], [("c", "a"), ("Ġ", "b"), ("Ġ", "Ġ")])
