"""Prompt lookup: what it proposes, and that it changes nothing but speed."""

from __future__ import annotations

import random

import pytest

from pipeline.decoding import generate
from pipeline.decoding.proposers.lookup import PromptLookup

from .conftest import perturbed, tiny_llama


def test_proposes_what_followed_the_longest_recent_match():
    lookup = PromptLookup(max_ngram=4, min_ngram=2)
    assert lookup.propose([5, 6, 7, 8, 1, 6, 7]) == 8  # "6 7" seen before, then 8
    assert lookup.propose([6, 7, 1, 6, 7, 2, 9, 6, 7]) == 2  # the most recent match wins
    assert lookup.propose([1, 2, 3, 9, 2, 3, 4, 1, 2, 3]) == 9  # 3-gram "1 2 3" beats 2-gram "2 3"
    assert lookup.propose([1, 2, 3, 4]) is None
    assert lookup.propose([7]) is None
    # byte patterns must match on token boundaries only
    assert lookup.propose([256, 1, 0, 0, 1, 256]) is None


@pytest.fixture(scope="module")
def pair():
    target = tiny_llama(70, vocab=24, hidden=32, layers=2)
    return target, perturbed(target, 0.1, seed=71)


def repetitive_prompts():
    out = []
    for i in range(5):
        rng = random.Random(i)
        phrase = [rng.randrange(24) for _ in range(4)]
        out.append(phrase + [rng.randrange(24)] + phrase + phrase[:2])
    return out


@pytest.mark.parametrize("kind", ["lookup", "lookup+draft"])
@pytest.mark.parametrize(
    "method,gamma,base",
    [("sd", 3, "large_model"), ("we_sd", 2, "we"), ("we_se", [1, 3], "we"), ("cd_se", [2, 2], "cd")],
)
def test_greedy_outputs_unchanged_and_lookup_used(pair, kind, method, gamma, base):
    lookup_accepted = 0
    for prompt in repetitive_prompts():
        ref = generate(list(pair), prompt, base, max_new_tokens=30).token_ids
        out = generate(list(pair), prompt, method, gamma=gamma, max_new_tokens=30, method_args={"proposer": kind})
        assert out.token_ids == ref, prompt
        lookup_accepted += out.stats.proposers["lookup"].accepted
        if kind == "lookup" and method.endswith("_se"):
            assert all(m.proposed == 0 for m in out.stats.models)  # no model drafts
    assert lookup_accepted > 0


def test_lookup_alone_needs_no_draft_model(pair):
    target, _ = pair
    prompt = repetitive_prompts()[0]
    ref = generate([target], prompt, "large_model", max_new_tokens=25).token_ids
    out = generate([target], prompt, "sd", gamma=4, max_new_tokens=25, method_args={"proposer": "lookup"})
    assert out.token_ids == ref
    assert out.stats.models[0].forward_calls < 25  # accepted lookups save target forwards
