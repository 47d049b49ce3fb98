"""Greedy losslessness: every accelerated method emits exactly its baseline's tokens."""

from __future__ import annotations

import random

import pytest

from pipeline.decoding import generate
from pipeline.decoding.ensembles import ENSEMBLES, conformance_ensembles
from pipeline.decoding.spec import method_names, parse_method

PROMPTS = [[random.Random(i).randrange(32) for _ in range(n)] for i, n in enumerate([1, 3, 8, 17, 5, 2])]
LENGTHS = [1, 6, 40]


def run(models, prompt, method, n, **kw):
    return generate(models, prompt, method, max_new_tokens=n, **kw)


@pytest.mark.spread("gamma", "n")  # make test: every gamma and every length, not every pair (tests/tiers.py)
@pytest.mark.parametrize("gamma", [1, 2, 3, 5, 8])
@pytest.mark.parametrize("n", LENGTHS)
def test_sd_equals_large_model(trio, gamma, n):
    target, draft, other = trio
    accepted = 0
    for pair in ([target, draft], [target, other]):
        for prompt in PROMPTS:
            base = run(pair, prompt, "large_model", n).token_ids
            result = run(pair, prompt, "sd", n, gamma=gamma)
            assert result.token_ids == base, (prompt, gamma)
            accepted += result.stats.accepted
    if n > 1:
        assert accepted > 0, "the close draft should have some tokens accepted"


# every registered ensemble, with the arguments it declared for these tests (``register_ensemble(test_args=)``)
ENSEMBLE_ARGS = conformance_ensembles()
PAIRABLE = sorted(e for e in ENSEMBLE_ARGS if ENSEMBLES[e].min_models <= 2)  # those that take two models
GAMMAS = {"_sd": [1, 2, 4, 7], "_se": [1, 3, [1, 4], [3, 1], [2, 2]]}


@pytest.mark.spread("proposer")  # make test: each ensemble's form with one first proposer, in turn
@pytest.mark.parametrize("ensemble", PAIRABLE)
@pytest.mark.parametrize("variant", ["_sd", "_se"])
@pytest.mark.parametrize("proposer", [0, 1])
def test_two_model_ensembles_equal_standard_ensemble(trio, ensemble, variant, proposer):
    target, draft, _ = trio
    models = [target, draft]
    args = ENSEMBLE_ARGS[ensemble]
    accepted = 0
    for prompt in PROMPTS:
        for n in LENGTHS:
            base = run(models, prompt, ensemble, n, method_args=args).token_ids
            for gamma in GAMMAS[variant]:
                result = run(
                    models, prompt, ensemble + variant, n, gamma=gamma, method_args={**args, "first_proposer": proposer}
                )
                assert result.token_ids == base, (prompt, n, gamma)
                accepted += result.stats.accepted
    assert accepted > 0


@pytest.mark.spread("proposer", "gamma")  # make test: every first proposer and every gamma, not every pair
@pytest.mark.parametrize("proposer", [0, 1, 2])
@pytest.mark.parametrize("gamma", [1, 2, [1, 2, 3], [3, 1, 1], [2, 4, 1]])
def test_three_model_weighted_ensemble(trio, proposer, gamma):
    weights = [0.5, 0.3, 0.2]
    for prompt in PROMPTS:
        base = run(list(trio), prompt, "we", 30, method_args={"weights": weights}).token_ids
        for method in ("we_se", "we_sd"):
            if method == "we_sd" and isinstance(gamma, list):
                continue
            result = run(
                list(trio),
                prompt,
                method,
                30,
                gamma=gamma,
                method_args={"weights": weights, "first_proposer": proposer},
            )
            assert result.token_ids == base, (method, prompt)


def test_greedy_weighted_ensemble_is_not_one_models_argmax(trio):
    """Greedy WE must take argmax of the mixture, which differs from each member's own argmax."""
    target, _, other = trio
    differs = 0
    for prompt in PROMPTS:
        ens = run([target, other], prompt, "we", 20, method_args={"lambda": 0.5}).token_ids
        differs += ens != run([target, other], prompt, "large_model", 20).token_ids
        differs += ens != run([target, other], prompt, "small_model", 20).token_ids
    assert differs >= len(PROMPTS)


def test_cd_expert_is_the_first_model_whatever_the_proposer(trio):
    target, draft, _ = trio
    prompt = PROMPTS[2]
    forward = run([target, draft], prompt, "cd", 20, method_args={"alpha": 0.5}).token_ids
    swapped = run([draft, target], prompt, "cd", 20, method_args={"alpha": 0.5}).token_ids
    assert forward != swapped
    for proposer in (0, 1):
        se = run(
            [target, draft], prompt, "cd_se", 20, gamma=[2, 2], method_args={"alpha": 0.5, "first_proposer": proposer}
        )
        assert se.token_ids == forward


PARALLEL = [m for m in method_names() if parse_method(m).kind == "parallel" and parse_method(m).base in ENSEMBLE_ARGS]


@pytest.mark.parametrize("method", PARALLEL)
def test_parallel_ensemble_equals_standard_ensemble(trio, method):
    base = parse_method(method).base
    target, draft, other = trio
    for models in ([target, draft], [target, other]):
        for prompt in PROMPTS:
            for n in LENGTHS:
                args = ENSEMBLE_ARGS[base]
                assert (
                    run(models, prompt, method, n, method_args=args).token_ids
                    == run(models, prompt, base, n, method_args=args).token_ids
                ), (prompt, n)


@pytest.mark.spread("gamma")  # make test: each method at one starting gamma, in turn
@pytest.mark.parametrize("method", ["sd", *(e + v for e in PAIRABLE for v in ("_sd", "_se"))])
@pytest.mark.parametrize("gamma", [1, 3])
def test_dynamic_gamma_equals_baseline(trio, method, gamma):
    """Each proposer's gamma moves between rounds (+2 / -1); the tokens are the baseline's."""
    spec = parse_method(method)
    target, draft, _ = trio
    args = ENSEMBLE_ARGS.get(spec.base, {})
    grown = 0
    for prompt in PROMPTS:
        for n in LENGTHS:
            base = run([target, draft], prompt, spec.base, n, method_args=args).token_ids
            for proposer in (0, 1) if spec.ensemble else (None,):
                kw = {} if proposer is None else {"first_proposer": proposer}
                g = [1, gamma] if spec.kind == "se" else gamma
                result = run(
                    [target, draft], prompt, method, n, gamma=g, gamma_schedule="dynamic", method_args={**args, **kw}
                )
                assert result.token_ids == base, (prompt, n, proposer)
                grown += len(result.stats.position_verified) > gamma  # a block longer than any fixed turn
    assert grown > 0, "the close draft should make some proposer's gamma grow"
