"""The peers: transformers' own speculative methods as grid methods (``pipeline/decoding/peers.py``).

Greedy ``hf_assisted`` and ``hf_prompt_lookup`` equal ``large_model`` token for
token on tiny float64 models. The bias test: with a vocabulary of 8, the exact
joint distribution of the first two tokens of the weighted ensemble
``r = (1 - lambda) p + lambda q`` is enumerated; our ``we_sd`` (gamma 1) and
transformers' ``assistant_ensemble_weight = 1 - lambda`` (``hf_assisted_ensemble``)
are each sampled N times with different seeds. Ours passes the chi-square test
at ALPHA; theirs is rejected, and its total variation from the exact joint is
close to the one computed from transformers' rule (a fully accepted block's
next token drawn from the target ``p`` alone) and above TV_BOUND.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pipeline.decoding import generate
from pipeline.decoding.audit import Audit
from pipeline.errors import ArgumentError

from .conftest import tiny_llama
from .test_sampling_lossless import chi_square_pvalue

VOCAB = 8
N = 1000
ALPHA = 1e-3  # the project's level (test_sampling_lossless.py)
TV_BOUND = 0.05  # transformers' measured total variation must exceed this
LAMBDA = 0.5
PROMPT = [1, 4, 2]
SAMPLING = {"temperature": 1.0, "top_k": 0, "top_p": 1.0}


@pytest.fixture(scope="module")
def pair():
    """A target and an unrelated draft, both peaked: p and q differ a lot, so the bias shows at a modest N."""
    return [tiny_llama(20, vocab=VOCAB, hidden=16, init=0.9), tiny_llama(21, vocab=VOCAB, hidden=16, init=0.9)]


def dist(model, tokens: list[int]) -> np.ndarray:
    with torch.no_grad():
        return torch.softmax(model(torch.tensor([tokens])).logits[0, -1], -1).numpy()


def exact_joints(pair) -> tuple[np.ndarray, np.ndarray]:
    """The weighted ensemble's exact joint of the first two tokens, and transformers' (gamma 1).

    transformers at gamma 1: the draft proposes a ~ q, accepted with min(1, v/q), v = w p + (1 - w) q, else
    the token is drawn from [p - q]+ (proportional to [v - q]+): the first token follows v. After an
    acceptance the next token is drawn from p alone; after a rejection the next round verifies against v.
    """
    w = 1 - LAMBDA
    p1, q1 = dist(pair[0], PROMPT), dist(pair[1], PROMPT)
    v1 = w * p1 + (1 - w) * q1
    accept = np.minimum(q1, v1)
    ours, theirs = np.zeros((VOCAB, VOCAB)), np.zeros((VOCAB, VOCAB))
    for a in range(VOCAB):
        p2, q2 = dist(pair[0], PROMPT + [a]), dist(pair[1], PROMPT + [a])
        v2 = w * p2 + (1 - w) * q2
        ours[a] = v1[a] * v2
        theirs[a] = accept[a] * p2 + (v1[a] - accept[a]) * v2
    return ours, theirs


def tv(a: np.ndarray, b: np.ndarray) -> float:
    return 0.5 * float(np.abs(a / a.sum() - b / b.sum()).sum())


def sampled_joint(pair, method: str) -> np.ndarray:
    counts = np.zeros((VOCAB, VOCAB))
    for seed in range(N):
        # three tokens: at max_new_tokens=2 transformers drafts nothing for the last one and draws it from p
        out = generate(
            pair, PROMPT, method, gamma=1, max_new_tokens=3, seed=seed, method_args={"lambda": LAMBDA}, **SAMPLING
        ).token_ids
        counts[out[0], out[1]] += 1
    return counts


@pytest.mark.exhaustive  # a claim about transformers' method, sampled at length; make test keeps ours exact
def test_assisted_ensemble_is_biased_and_ours_is_exact(pair):
    exact, their_rule = exact_joints(pair)
    ours = sampled_joint(pair, "we_sd")
    theirs = sampled_joint(pair, "hf_assisted_ensemble")
    p_ours, p_theirs = chi_square_pvalue(ours, exact), chi_square_pvalue(theirs, exact)
    tv_ours, tv_theirs, tv_rule = tv(ours, exact), tv(theirs, exact), tv(their_rule, exact)
    print(
        f"\nfirst two tokens, vocabulary {VOCAB}, gamma 1, T 1, lambda {LAMBDA}, N {N}: "
        f"TV(we_sd, exact WE) = {tv_ours:.3f} (chi-square p = {p_ours:.3g}); "
        f"TV(hf_assisted_ensemble, exact WE) = {tv_theirs:.3f} (p = {p_theirs:.3g}); "
        f"TV of transformers' rule, computed = {tv_rule:.3f}"
    )
    assert p_ours > ALPHA
    assert p_theirs < ALPHA
    assert tv_rule > TV_BOUND and tv_theirs > TV_BOUND
    assert tv(theirs, their_rule) < tv_theirs  # theirs is nearer its own rule than the ensemble
    assert chi_square_pvalue(theirs, their_rule) > ALPHA  # and follows it: the bias is the bonus token's


@pytest.mark.parametrize("method", ["hf_assisted", "hf_prompt_lookup"])
@pytest.mark.parametrize("gamma", [1, 3])
def test_greedy_peers_equal_large_model(trio, method, gamma):
    target, draft, _ = trio
    for prompt in ([1, 2, 3, 4], [5, 6, 7, 5, 6, 7, 5, 6]):
        want = generate([target, draft], prompt, "large_model", max_new_tokens=24).token_ids
        got = generate([target, draft], prompt, method, gamma=gamma, max_new_tokens=24)
        assert got.token_ids == want
        assert got.stats.new_tokens == 24 and got.stats.wall_time_s > 0
        assert got.stats.models[0].forward_calls >= 1  # counted by forward hooks
        assert (got.stats.models[1].forward_calls > 0) == (method == "hf_assisted")
        assert got.stats.rounds is None and got.stats.accepted is None  # not counted: absent, not invented


def test_peers_stop_where_ours_stop(trio):
    target, draft, _ = trio
    ours = generate([target, draft], [1, 2, 3, 4], "large_model", max_new_tokens=24).token_ids
    eos = ours[5]
    want = generate([target, draft], [1, 2, 3, 4], "sd", gamma=3, max_new_tokens=24, eos_token_id=eos)
    got = generate([target, draft], [1, 2, 3, 4], "hf_assisted", gamma=3, max_new_tokens=24, eos_token_id=eos)
    assert got.token_ids == want.token_ids == ours[: ours.index(eos) + 1]
    assert got.stats.stop_reason == "eos"
    assert generate([target, draft], [1, 2], "hf_assisted", max_new_tokens=0).token_ids == []


def test_peers_stop_at_stop_strings_as_ours(tiny_dir, smol_tokenizer):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_dir).eval()
    prompt = smol_tokenizer("def add(a, b):").input_ids
    kw = {"max_new_tokens": 16, "tokenizer": smol_tokenizer}
    free = generate([model, model], prompt, "large_model", **kw).token_ids
    stop = smol_tokenizer.decode(free[5:7])
    want = generate([model, model], prompt, "large_model", stop_strings=[stop], **kw)
    got = generate([model, model], prompt, "hf_assisted", gamma=4, stop_strings=[stop], **kw)
    assert want.stats.stop_reason == got.stats.stop_reason == "stop_string"
    assert got.token_ids == want.token_ids and len(got.token_ids) <= 7


def test_peer_checks(trio):
    target, draft, _ = trio
    with pytest.raises(ArgumentError, match="strictly between 0 and 1"):
        generate([target, draft], [1, 2], "hf_assisted_ensemble", method_args={"lambda": 0.0})
    with pytest.raises(ArgumentError, match="unknown method_args"):
        generate([target, draft], [1, 2], "hf_assisted", method_args={"proposer": "lookup"})
    with pytest.raises(ArgumentError, match="needs 2 models"):
        generate([target], [1, 2], "hf_assisted")
    with pytest.raises(ArgumentError, match="list is for"):
        generate([target, draft], [1, 2], "hf_assisted", gamma=[1, 2])
    with pytest.raises(ArgumentError, match="an audit checks our decoder only"):
        generate([target, draft], [1, 2], "hf_assisted", audit=Audit([target, draft]))
    draft.restricted_vocab = True
    try:
        with pytest.raises(ArgumentError, match="restricted"):
            generate([target, draft], [1, 2], "hf_assisted")
        generate([target, draft], [1, 2], "hf_prompt_lookup", max_new_tokens=2)  # the draft is not used
    finally:
        del draft.restricted_vocab


def test_ours_over_a_peer_is_the_ratio_of_side_by_side_speedups():
    from pipeline.measure.speed import relative_speedup

    def row(i: int, wall: float, base_wall: float) -> dict:
        stats = {"new_tokens": 10, "wall_time_s": wall}
        return {"id": str(i), "stats": stats, "baseline": {"stats": {"new_tokens": 10, "wall_time_s": base_wall}}}

    # the peer's job ran on a machine twice as slow (its standard too): the drift cancels
    ours = [row(i, 1.0 + 0.01 * i, 2.0) for i in range(6)]
    peer = [row(i, 4.0 + 0.04 * i, 4.0) for i in range(6)]
    estimate, low, high = relative_speedup(ours, peer)
    assert low <= estimate <= high and estimate == pytest.approx(2.0)  # 1.95x over 0.98x
    assert relative_speedup(ours, [{k: v for k, v in r.items() if k != "baseline"} for r in peer]) is None
