"""Edge cases of the stopping rules, gamma, top-p and greedy ties."""

from __future__ import annotations

import copy

import pytest
import torch

from pipeline.decoding import generate, register_ensemble
from pipeline.decoding.ensembles import ENSEMBLES

from .conftest import perturbed, tiny_llama

PROMPT = [3, 1, 4, 1, 5]


@pytest.fixture(scope="module")
def pair():
    target = tiny_llama(20, layers=2, hidden=32)
    return target, copy.deepcopy(target)  # a perfect draft: every proposal is accepted


def baseline(models, n=30, **kw):
    return generate(models, PROMPT, "large_model", max_new_tokens=n, **kw).token_ids


@pytest.mark.parametrize("method,gamma", [("sd", 4), ("we_sd", 4), ("we_se", [1, 4]), ("we_se", [4, 4])])
def test_eos_inside_an_accepted_draft(pair, method, gamma):
    tokens = baseline(pair)
    eos = next(t for i, t in enumerate(tokens) if i % 4 not in (0, 3) and t not in tokens[:i])
    cut = tokens.index(eos) + 1
    args = {"lambda": 0.5} if method.startswith("we") else {}
    result = generate(pair, PROMPT, method, gamma=gamma, max_new_tokens=30, eos_token_id=eos, method_args=args)
    assert result.token_ids == tokens[:cut]
    assert result.stats.stop_reason == "eos"
    assert result.stats.accepted > 0


@pytest.mark.parametrize("n", [1, 2, 5, 6, 7, 9])
@pytest.mark.parametrize("method,gamma", [("sd", 4), ("we_se", [4, 4]), ("we_sd", 3)])
def test_max_new_tokens_reached_mid_round(pair, n, method, gamma):
    args = {"lambda": 0.5} if method.startswith("we") else {}
    result = generate(pair, PROMPT, method, gamma=gamma, max_new_tokens=n, method_args=args)
    assert result.token_ids == baseline(pair, n)
    assert len(result.token_ids) == n
    assert result.stats.stop_reason == "max_new_tokens"


def test_zero_new_tokens(pair):
    result = generate(pair, PROMPT, "sd", gamma=3, max_new_tokens=0)
    assert result.token_ids == []
    assert sum(m.forward_calls for m in result.stats.models) == 0


def test_perfect_draft_accepts_everything(pair):
    result = generate(pair, PROMPT, "sd", gamma=4, max_new_tokens=25)
    target, draft = result.stats.models
    assert draft.acceptance_rate == 1.0
    assert target.forward_calls == 5  # 25 tokens = 5 rounds of 4 accepted + 1 bonus
    assert result.stats.rounds == 5
    assert result.stats.tau == 5.0  # tokens per target forward: 4 accepted + the verifier's own
    assert result.stats.position_verified == [5, 5, 5, 5] and result.stats.position_accepted == [5, 5, 5, 5]


def test_gamma_one(pair):
    target, _ = pair
    draft = perturbed(target, 0.1, seed=3)
    for method, gamma in (("sd", 1), ("we_sd", 1), ("we_se", 1), ("we_se", [1, 1])):
        args = {"lambda": 0.3} if method.startswith("we") else {}
        ref = "large_model" if method == "sd" else "we"
        base = generate([target, draft], PROMPT, ref, max_new_tokens=20, method_args=args).token_ids
        result = generate([target, draft], PROMPT, method, gamma=gamma, max_new_tokens=20, method_args=args)
        assert result.token_ids == base
        assert result.stats.models[1].forward_calls > 0


def test_top_p_so_small_that_one_token_survives(pair):
    target, _ = pair
    draft = perturbed(target, 0.2, seed=4)
    greedy = baseline([target, draft], 15)
    for seed in range(5):
        for method in ("large_model", "sd"):
            out = generate(
                [target, draft], PROMPT, method, gamma=3, max_new_tokens=15, temperature=1.0, top_p=1e-9, seed=seed
            )
            assert out.token_ids == greedy


@register_ensemble("rounded_mean", params={"scale": 1.0}, test_args=None)  # ties on purpose: its own tests
def rounded_mean(logits, sampling, scale):
    """A target with many exact ties: the mean logits rounded to a grid of ``scale``."""
    from pipeline.decoding.sampling import probs

    return probs(torch.round(torch.stack(logits).mean(dim=0) / scale), sampling)


def test_ties_under_greedy():
    """Greedy keeps the first of tied target tokens, in the baseline and when verifying.

    Exact ties in one model's logits do not survive batched matrix kernels (a
    k-row forward may round tied columns differently from a one-row forward),
    so the ties are made in the target itself: mean logits rounded to a grid.
    """
    target = tiny_llama(30, vocab=32, hidden=32, layers=2)
    draft = perturbed(target, 0.15, seed=31)
    models = [target, draft]
    args = {"scale": 0.5}
    base = generate(models, PROMPT, "rounded_mean", max_new_tokens=40, method_args=args).token_ids
    with torch.no_grad():
        seq = torch.tensor([PROMPT + base])
        scores = torch.round(torch.stack([m(seq).logits[0] for m in models]).mean(0) / 0.5)
    scores = scores[len(PROMPT) - 1 : -1]
    ties = int(((scores == scores.amax(-1, keepdim=True)).sum(-1) > 1).sum())
    assert ties >= 3, f"only {ties} tied steps: the test needs ties"
    for method, gamma in (("rounded_mean_sd", 3), ("rounded_mean_se", [2, 3]), ("rounded_mean_se", [3, 1])):
        for proposer in (0, 1):
            out = generate(
                models, PROMPT, method, gamma=gamma, max_new_tokens=40, method_args={**args, "first_proposer": proposer}
            )
            assert out.token_ids == base, (method, gamma, proposer)


class CharTokenizer:
    """Token i decodes to the i-th letter: enough to test stop strings."""

    def decode(self, ids, **kwargs):
        return "".join(chr(ord("a") + i % 26) for i in ids)


@pytest.mark.parametrize("method,gamma", [("large_model", 1), ("sd", 4), ("we_se", [2, 3])])
def test_stop_strings(pair, method, gamma):
    tok = CharTokenizer()
    full = baseline(pair, 30)
    text = tok.decode(full)
    stop = text[7:9]
    cut = text.index(stop) + len(stop)
    args = {"lambda": 0.5} if method.startswith("we") else {}
    out = generate(
        pair, PROMPT, method, gamma=gamma, max_new_tokens=30, stop_strings=[stop], tokenizer=tok, method_args=args
    )
    assert out.token_ids == full[:cut]
    assert out.text.endswith(stop) and out.stats.stop_reason == "stop_string"


def test_same_seed_same_tokens(pair):
    target, _ = pair
    draft = perturbed(target, 0.2, seed=5)
    kw = dict(method="we_se", gamma=[1, 3], max_new_tokens=30, temperature=1.0, method_args={"lambda": 0.5})
    a = generate([target, draft], PROMPT, seed=7, **kw).token_ids
    assert a == generate([target, draft], PROMPT, seed=7, **kw).token_ids
    assert a != generate([target, draft], PROMPT, seed=8, **kw).token_ids


def test_custom_ensemble_gets_every_method():
    name = "max_mix"
    if name not in ENSEMBLES:

        @register_ensemble(name, params={"sharpness": 1.0}, test_args=None)
        def max_mix(logits, sampling, sharpness):
            from pipeline.decoding.sampling import probs

            p = torch.stack([probs(l * sharpness, sampling) for l in logits]).amax(dim=0)
            return p / p.sum(dim=-1, keepdim=True)

    target = tiny_llama(40, layers=2, hidden=32)
    draft = perturbed(target, 0.1, seed=41)
    base = generate([target, draft], PROMPT, name, max_new_tokens=25, method_args={"sharpness": 2.0}).token_ids
    for method, gamma in ((f"{name}_sd", 3), (f"{name}_se", [1, 3])):
        out = generate([target, draft], PROMPT, method, gamma=gamma, max_new_tokens=25, method_args={"sharpness": 2.0})
        assert out.token_ids == base


def test_mixture_runs_only_the_drawn_member_and_each_token_once(pair):
    """``we_me``: one forward per position (the drawn member's, over what it missed); weight zero: never run."""
    target, _ = pair
    models = [target, perturbed(target, 0.2, seed=5), tiny_llama(21)]
    n = 40
    kw = dict(max_new_tokens=n, temperature=1.0, method_args={"weights": [0.6, 0.4, 0.0]})
    out = generate(models, PROMPT, "we_me", seed=3, **kw)
    calls = [m.forward_calls for m in out.stats.models]
    assert len(out.token_ids) == n and sum(calls) == n and calls[2] == 0 and min(calls[:2]) > 0
    for m in out.stats.models[:2]:  # each token fed once: at most the prompt and every token but the last
        assert m.forwarded_tokens <= len(PROMPT) + n - 1
    assert out.token_ids == generate(models, PROMPT, "we_me", seed=3, **kw).token_ids
    assert out.token_ids != generate(models, PROMPT, "we_me", seed=4, **kw).token_ids


def test_mixture_stops_at_eos(pair):
    target, _ = pair
    models = [target, perturbed(target, 0.2, seed=5)]
    kw = dict(max_new_tokens=30, temperature=1.0, method_args={"lambda": 0.5}, seed=2)
    tokens = generate(models, PROMPT, "we_me", **kw).token_ids
    eos = tokens[10]
    out = generate(models, PROMPT, "we_me", eos_token_id=eos, **kw)
    assert out.token_ids == tokens[: tokens.index(eos) + 1] and out.stats.stop_reason == "eos"


@pytest.mark.parametrize("n", [1, 2, 5, 7])
def test_speculative_mixture_stops_at_max_new_tokens_mid_round(pair, n):
    target, _ = pair
    models = [target, perturbed(target, 0.2, seed=5)]
    out = generate(models, PROMPT, "we_me_sd", gamma=4, max_new_tokens=n, temperature=1.0, method_args={"lambda": 0.5})
    assert len(out.token_ids) == n and out.stats.stop_reason == "max_new_tokens"
    assert out.stats.models[0].proposed == 0  # the other (the cheaper on a tie) drafts
