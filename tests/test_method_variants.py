"""Parallel ensembles (``E_p``), the dynamic gamma schedule and the gated ensemble ``gac``.

Their losslessness is proven with every other method's (``test_greedy_lossless.py``,
``test_sampling_lossless.py``, ``test_audit.py``); here: what is particular to each.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from pipeline.decoding import generate, register_ensemble
from pipeline.decoding.loop import DynamicGamma
from pipeline.decoding.spec import parse_method
from pipeline.errors import ArgumentError
from pipeline.experiment.config import check_config
from pipeline.experiment.grid import expand_cells

from .conftest import perturbed, tiny_llama, without_null

ROOT = Path(__file__).resolve().parent.parent
PROMPT = [3, 1, 4, 1, 5, 9, 2, 6]


@pytest.fixture(scope="module")
def pair():
    target = tiny_llama(30, layers=2, hidden=32)
    return [target, perturbed(target, 0.1, seed=31)]


# ---- a method's forms ---------------------------------------------------------------------


def test_every_name_parsing_and_reserved_suffix_comes_from_the_forms_table():
    """forms.FORMS is the one table: each ensemble's names are its forms' suffixes (a mixture's only for a mixture
    ensemble), each parses back to its form, and no ensemble can be registered under a name ending in one."""
    from pipeline.decoding.ensembles import ENSEMBLES
    from pipeline.decoding.forms import FORMS, SUFFIXES
    from pipeline.decoding.spec import method_names

    names = set(method_names())
    for name, ensemble in ENSEMBLES.items():
        for form in FORMS:
            if form.suffix is None:
                continue
            takes = not form.mixture or ensemble.mixture
            assert (name + form.suffix in names) == takes, (name, form.kind)
            if takes:
                assert parse_method(name + form.suffix).form is form
            else:
                with pytest.raises(ArgumentError, match="unknown method"):
                    parse_method(name + form.suffix)
    assert set(SUFFIXES) == {"_p", "_sd", "_se", "_me", "_me_sd"}
    for suffix in SUFFIXES:
        with pytest.raises(ArgumentError, match="name taken or not a plain identifier"):
            register_ensemble("mine" + suffix)(lambda logits, sampling: logits[0])
    assert parse_method("we_me_sd").base == "we" and parse_method("sd").kind == "sd"


# ---- parallel ensembles ------------------------------------------------------------------


def test_parallel_methods_are_plain_ensembles_run_concurrently():
    spec = parse_method("we_p")
    assert (spec.base, spec.kind, spec.speculative) == ("we", "parallel", False)
    assert "gamma" not in spec.accepted_args() and "proposer" not in spec.accepted_args()
    with pytest.raises(ArgumentError, match="cannot register ensemble 'x_p'"):
        register_ensemble("x_p")(lambda logits, sampling: logits[0])


@pytest.mark.parametrize("method,args", [("we_p", {"lambda": 0.3}), ("cd_p", {"alpha": 0.2}), ("gac_p", {})])
def test_parallel_sampling_draws_the_standard_ensembles_tokens_seed_for_seed(pair, method, args):
    """Only the scheduling of the forwards differs, so the same seed gives the same tokens."""
    base = parse_method(method).base
    for seed in range(5):
        kw = {"max_new_tokens": 30, "temperature": 0.9, "top_p": 0.9, "method_args": args, "seed": seed}
        assert generate(pair, PROMPT, method, **kw).token_ids == generate(pair, PROMPT, base, **kw).token_ids


def test_parallel_splits_the_thread_budget_and_restores_it(pair, monkeypatch):
    seen = []
    from pipeline.decoding import member

    catch_up = member.Member.catch_up

    def recording(self, tokens, committed):
        seen.append(torch.get_num_threads())
        catch_up(self, tokens, committed)

    monkeypatch.setattr(member.Member, "catch_up", recording)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(4)
        generate(pair, PROMPT, "we_p", max_new_tokens=5, method_args={"lambda": 0.5})
        assert set(seen) == {2}  # 4 threads, 2 members: 2 each
        assert torch.get_num_threads() == 4
        seen.clear()
        torch.set_num_threads(1)
        generate(pair, PROMPT, "we_p", max_new_tokens=5, method_args={"lambda": 0.5})
        assert set(seen) == {1}  # at least one each: 2 threads in all
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


def test_a_members_error_in_a_parallel_forward_is_raised(pair, monkeypatch):
    from pipeline.decoding import runner

    def broken(self, tokens, keep):
        raise RuntimeError("forward failed")

    monkeypatch.setattr(runner.HFRunner, "extend", broken)
    with pytest.raises(RuntimeError, match="forward failed"):
        generate(pair, PROMPT, "we_p", max_new_tokens=3)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_parallel_on_cuda_streams_equals_the_standard_ensemble(pair):
    models = [m.to("cuda") for m in pair]
    try:
        for method, args in (("we_p", {"lambda": 0.4}), ("cd_p", {"alpha": 0.3})):
            base = parse_method(method).base
            for kw in ({}, {"temperature": 0.8, "seed": 3}):
                a = generate(models, PROMPT, method, max_new_tokens=40, method_args=args, **kw).token_ids
                assert a == generate(models, PROMPT, base, max_new_tokens=40, method_args=args, **kw).token_ids
    finally:
        for m in models:
            m.to("cpu")


# ---- dynamic gamma -----------------------------------------------------------------------


def test_dynamic_gamma_rule():
    rule = DynamicGamma()
    assert [rule.next(3, True), rule.next(3, False), rule.next(1, False), rule.next(15, True)] == [5, 2, 1, 16]


def test_dynamic_gamma_moves_with_acceptance(pair):
    """A draft identical to the target is always accepted: the gamma climbs +2 a round up to its bound."""
    target = pair[0]
    out = generate([target, target], PROMPT, "sd", gamma=1, max_new_tokens=120, gamma_schedule="dynamic")
    assert len(out.stats.position_verified) == DynamicGamma().high
    rounds = out.stats.rounds
    assert out.stats.position_verified[:5] == [rounds, rounds - 1, rounds - 1, rounds - 2, rounds - 2]  # 1, 3, 5...
    assert out.method_args["gamma_schedule"] == "dynamic"


def test_bad_gamma_schedule_is_one_line(pair):
    with pytest.raises(ArgumentError, match=r"gamma_schedule='growing': expected one of fixed, dynamic"):
        generate(pair, PROMPT, "sd", gamma_schedule="growing")


def test_dynamic_gamma_cells_are_named_apart():
    config = check_config(
        {
            "models": {"big": {}, "small": {}},
            "grids": [
                {"name": "g", "model_sets": {"pair": ["big", "small"]}, "methods": ["we", "we_p", "sd", "we_se"]}
            ],
            "gamma": [2],
            "gamma_schedule": ["fixed", "dynamic"],
        }
    )
    cells = expand_cells(config)
    assert without_null(cells) == [
        "humaneval/pair/sd-T0-g2",
        "humaneval/pair/sd-T0-g2dyn",
        "humaneval/pair/we-T0",
        "humaneval/pair/we_p-T0",
        "humaneval/pair/we_se-T0-g1-2",
        "humaneval/pair/we_se-T0-g1-2dyn",
    ]
    assert cells["humaneval/pair/sd-T0-g2dyn"].cell.gamma_schedule == "dynamic"
    assert "gamma_schedule" not in cells["humaneval/pair/sd-T0-g2"].cell.to_json()  # fixed cells keep their form
    assert cells["humaneval/pair/sd-T0-g2dyn"].dims.gamma == "2dyn"
    parallel = cells["humaneval/pair/we_p-T0"]
    assert parallel.cell.baseline == "we" and parallel.dims.standard == "we"
    assert parallel.dims.gamma is None


# ---- the gated ensemble ------------------------------------------------------------------


def test_the_gate_picks_the_lead_model_where_it_is_confident():
    from pipeline.decoding.ensembles import ENSEMBLES
    from pipeline.decoding.sampling import Sampling

    gac = ENSEMBLES["gac"].fn
    lead = torch.tensor([[4.0, 0.0, 0.0], [0.0, 0.1, 0.0]], dtype=torch.float64)  # confident, then not
    other = torch.tensor([[0.0, 3.0, 0.0], [0.0, 0.0, 3.0]], dtype=torch.float64)
    r = gac([lead, other], Sampling.identity(), threshold=0.5, weights=[0.5, 0.5])
    assert torch.allclose(r[0], torch.softmax(lead[0], -1))
    assert torch.allclose(r[1], 0.5 * torch.softmax(lead[1], -1) + 0.5 * torch.softmax(other[1], -1))


def test_gac_differs_from_both_we_and_the_lead_model(pair):
    other = tiny_llama(32)
    models = [pair[0], other]
    gac = generate(models, PROMPT, "gac", max_new_tokens=40, method_args={"threshold": 0.5}).token_ids
    assert gac != generate(models, PROMPT, "we", max_new_tokens=40).token_ids
    assert gac != generate(models, PROMPT, "large_model", max_new_tokens=40).token_ids
    everywhere = generate(models, PROMPT, "gac", max_new_tokens=40, method_args={"threshold": 1.0}).token_ids
    assert everywhere == generate(models, PROMPT, "we", max_new_tokens=40).token_ids


@pytest.mark.parametrize("threshold", [0, -0.1, 1.5, float("nan"), "high", True])
def test_bad_threshold_is_one_line(pair, threshold):
    with pytest.raises(ArgumentError, match=r"threshold=.* is outside the accepted range \(0, 1\]"):
        generate(pair, PROMPT, "gac", method_args={"threshold": threshold})


def test_the_docs_example_is_the_registered_code():
    """docs/extending.md's worked example of ``register_ensemble`` is the code of ``gac``, verbatim."""
    readme = (ROOT / "docs" / "extending.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", readme, re.S)
    example = next(b for b in blocks if "def gated_ensemble(" in b)
    source = (ROOT / "pipeline" / "decoding" / "ensembles" / "gac.py").read_text()
    assert example.strip() in source


def test_the_largest_models_turn_keeps_its_gamma(pair, monkeypatch):
    """Its drafts cost one of its own forwards a token: a dynamic schedule leaves its gamma alone."""
    from pipeline.decoding import loop
    from pipeline.decoding.methods import fixed_turns, parameter_counts, plan_method

    big, small = pair[0], tiny_llama(33)
    sizes = parameter_counts([big, small])
    plan, _ = plan_method("we_se", sizes, [1, 2], {})
    assert [turn for turn, _ in plan.schedule] == [(1,), (0,)] and fixed_turns(plan.schedule, sizes) == {1}
    drafts = []
    draft = loop.Decoder._draft

    def recording(self, proposer, gamma, turn):
        drafts.append((turn, gamma))
        draft(self, proposer, gamma, turn)

    monkeypatch.setattr(loop.Decoder, "_draft", recording)
    generate([big, pair[1]], PROMPT, "we_se", gamma=[1, 1], max_new_tokens=60, gamma_schedule="dynamic")
    assert {g for turn, g in drafts if turn == 1} == {1}  # model 0, the larger (earlier on a tie), proposes second
    assert max(g for turn, g in drafts if turn == 0) > 1


def test_generates_settings_are_one_object_with_its_keywords_and_defaults(pair, monkeypatch):
    """``generate`` keeps its keyword signature and carries the settings behind it as one ``Settings``: the two
    cannot drift (every keyword is a field, in order, with the same default), what ``decode`` is handed is what
    was asked for, and the tokens are the same either way."""
    import dataclasses
    import inspect

    from pipeline.decoding import Settings, decode, methods

    keywords = list(inspect.signature(generate).parameters.values())[2:]  # past the models and the prompt
    fields = dataclasses.fields(Settings)
    assert [(p.name, p.default) for p in keywords] == [(f.name, f.default) for f in fields]
    asked = dict(method="we_sd", gamma=2, max_new_tokens=12, temperature=1.0, top_k=5, seed=3)
    handed = []
    real = methods.decode
    monkeypatch.setattr(methods, "decode", lambda m, p, s: handed.append(s) or real(m, p, s))
    tokens = generate(list(pair), [3, 1, 4], **asked).token_ids
    assert handed == [Settings(**asked)]
    assert decode(list(pair), [3, 1, 4], Settings(**asked)).token_ids == tokens
