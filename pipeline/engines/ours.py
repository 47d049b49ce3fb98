"""Our decoder's behaviour (``decoding/engines.py``'s ``ours``): a cell's models loaded, and run by ``generate``."""

from __future__ import annotations

from contextlib import ExitStack
from functools import partial
from typing import Any

from ..decoding import generate
from ..decoding.corpus import Corpus
from ..decoding.engines import Runs, RunsCell
from ..decoding.proposers import capabilities, parse_proposer
from ..decoding.runner import runner_of
from ..decoding.static import compile_ahead
from ..decoding.tree.loop import parse_tree
from ..decoding.union import check_joinable
from ..models import decode_vocabulary, load_members, tokenizer_rows
from ..models.corpus import teacher_documents
from ..provenance import provenance
from .base import Behaviour


def reads_corpus(cell: RunsCell) -> bool:
    """Whether the cell's method has a proposer that reads the job's corpus (``suffix``, ``recycle``)."""
    proposer = cell.method_args.get("proposer")
    if proposer is None:  # no proposer of ours (another engine's methods take none)
        return False
    return any(capabilities(c).reads_corpus for c in parse_proposer(proposer).classes())


def job_corpus(cell: RunsCell, union: bool, vocab: int) -> Corpus:
    """The job's corpus (``decoding/corpus.py``): the target's own text in the model cache (``models/corpus.py``;
    none for models of different tokenizers, which decode over the union's ids), then each prompt's output as it
    is done. It lives in this job's memory only."""
    if union:
        return Corpus([], "no fixed documents: the set's models decode over the union of their vocabularies")
    documents, source = teacher_documents(cell.models, vocab)
    return Corpus(documents, source)


def runs(cell: RunsCell, stack: ExitStack) -> Runs:
    """The cell's runs by our decoder (and transformers' ``generate`` for its ``hf_*``, ``decoding/peers.py``): its
    models loaded, and what makes them ready once the prompts are known (``stack``: nothing of ours to close). A
    sample's ids are the union's where the set's tokenizers differ, else the first model's (the rows they reach),
    its output their text with special tokens skipped."""
    models, tokenizers = load_members(cell.models)
    tokenizer = tokenizers[0]  # prompts are the first model's tokens
    vocabulary = decode_vocabulary(models, tokenizers)  # different tokenizers: their union; padded heads: cropped
    # every run of the cell: its models and settings (methods that do not speculate ignore gamma_schedule)
    run = partial(
        generate, models, eos_token_id=tokenizer.eos_token_id, tokenizer=tokenizer, **vocabulary, **cell.sampling()
    )

    def prepare(prompts: dict[str, list[int]]) -> dict[str, Any]:
        nodes = parse_tree(cell.tree).nodes + 1 if cell.tree is not None else 0  # a tree's masked forwards too
        compile_ahead(models, [len(p) + cell.max_new_tokens + 1 for p in prompts.values()], tree_tokens=nodes)
        return provenance(next(models[0].parameters()).device, {runner_of(m)[0] for m in models})

    union = "tokenizers" in vocabulary
    if union:  # a sample's ids are the union's, and its text the union's
        joined = check_joinable(vocabulary["tokenizers"])
        vocab, text = joined.size, joined.text
    else:
        vocab, text = tokenizer_rows(tokenizer), partial(tokenizer.decode, skip_special_tokens=True)
    corpus = job_corpus(cell, union, len(tokenizer)) if reads_corpus(cell) else None
    return Runs(run, tokenizer, prepare, vocab, text, corpus)


OURS = Behaviour(runs)
