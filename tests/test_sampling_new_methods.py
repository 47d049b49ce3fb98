"""Sampling losslessness of the methods added since the paper: the parallel ensembles, the gated
ensemble, dynamic gamma and the mixture draw (``we_me``, ``we_me_sd``), by the same exact-joint
chi-square check as ``test_sampling_lossless.py`` (a file of its own, so the two run side by side)."""

from __future__ import annotations

import pytest

from pipeline.decoding.ensembles import ENSEMBLES, conformance_ensembles

from .test_sampling_lossless import (
    ALPHA,
    SETTINGS,
    TWO,
    case_id,
    check_case,
    chi_square_pvalue,
    empirical_joint,
    exact_joint,
    make_models,
    reference,
)


@pytest.fixture(scope="module")
def models():
    return make_models()


GAC = {"weights": [0.5, 0.5], "threshold": 0.8}  # the target is confident at 3 of the 7 positions sampled
DYNAMIC = {"gamma_schedule": "dynamic"}
CASES = [
    # (method, model indices, reference kind, reference args, generate kwargs)
    # the parallel ensembles, the gated ensemble, dynamic gamma (a rejection shortens the next round's draft)
    ("we_p", [0, 1], "we", {"weights": [0.5, 0.5]}, {"method_args": TWO["we"]}),
    ("cd_p", [0, 1], "cd", {"alpha": 0.3}, {"method_args": TWO["cd"]}),
    ("gac", [0, 1], "gac", GAC, {"method_args": TWO["gac"]}),
    ("gac_sd", [0, 1], "gac", GAC, {"method_args": TWO["gac"], "gamma": 2}),
    ("gac_se", [0, 1], "gac", GAC, {"method_args": {**TWO["gac"], "first_proposer": 0}, "gamma": [2, 1]}),
    ("sd", [0, 1], "single", {}, {"gamma": 2, **DYNAMIC}),
    ("we_sd", [0, 1], "we", {"weights": [0.5, 0.5]}, {"method_args": TWO["we"], "gamma": 2, **DYNAMIC}),
    ("we_se", [0, 1], "we", {"weights": [0.5, 0.5]}, {"method_args": TWO["we"], "gamma": [2, 1], **DYNAMIC}),
    # the mixture draw: a member by weight, then the token from that member alone
    ("we_me", [0, 1], "we", {"weights": [0.5, 0.5]}, {"method_args": TWO["we"]}),
    ("we_me", [0, 2], "we", {"weights": [0.8, 0.2]}, {"method_args": {"lambda": 0.2}}),
    ("we_me", [0, 1, 2], "we", {"weights": [0.2, 0.3, 0.5]}, {"method_args": {"weights": [0.2, 0.3, 0.5]}}),
    ("we_me", [0, 3], "we", {"weights": [0.4, 0.6]}, {"method_args": {"lambda": 0.6}}),  # a restricted head
    # ... with runs of a member's positions decoded speculatively, another member drafting
    ("we_me_sd", [0, 1], "we", {"weights": [0.5, 0.5]}, {"method_args": TWO["we"], "gamma": 2}),
    (
        "we_me_sd",
        [0, 2],
        "we",
        {"weights": [0.8, 0.2]},
        {"method_args": {"lambda": 0.2, "first_proposer": 1}, "gamma": 3},
    ),
    (
        "we_me_sd",
        [0, 2],
        "we",
        {"weights": [0.5, 0.5]},
        {"method_args": {"lambda": 0.5, "first_proposer": 0}, "gamma": 1},  # the large model drafts
    ),
    (
        "we_me_sd",
        [0, 2],
        "we",
        {"weights": [0.5, 0.5]},
        {"method_args": {"lambda": 0.5, "first_proposer": 1}, "gamma": 2},
    ),
    (
        "we_me_sd",
        [0, 1, 2],
        "we",
        {"weights": [0.2, 0.3, 0.5]},
        {"method_args": {"weights": [0.2, 0.3, 0.5], "first_proposer": 1}, "gamma": 2},
    ),
    (
        "we_me_sd",
        [0, 3],
        "we",
        {"weights": [0.4, 0.6]},
        {"method_args": {"lambda": 0.6, "first_proposer": 1}, "gamma": 2},  # a restricted head drafts
    ),
]
# dynamic gamma in every other registered ensemble (``register_ensemble``), with the arguments it declared for these
# tests: each proposer's gamma moves
CASES += [
    (name + "_se", [0, 1], *reference(name, args), {"method_args": args, "gamma": [2, 1], **DYNAMIC})
    for name, args in conformance_ensembles().items()
    if name != "we" and ENSEMBLES[name].min_models <= 2
]


@pytest.mark.spread("setting")  # make test: each case at one setting, the settings in turn (tests/tiers.py)
@pytest.mark.parametrize("setting", SETTINGS, ids=lambda s: "T{temperature}-k{top_k}-p{top_p}".format(**s))
@pytest.mark.parametrize("case", CASES, ids=lambda c: case_id(c))
def test_first_two_tokens_follow_the_target(models, case, setting):
    check_case(models, case, setting)


def test_the_check_sees_the_mixture_weights(models):
    """A mixture drawn with the wrong weights (0.5/0.5 instead of 0.8/0.2) must fail the check."""
    setting = SETTINGS[0]
    pair = [models[0], models[2]]
    expected = exact_joint("we", pair, setting, {"weights": [0.8, 0.2]})
    counts = empirical_joint(pair, "we_me", setting, method_args={"lambda": 0.5})
    assert chi_square_pvalue(counts, expected) < ALPHA


def test_the_check_sees_a_drafter_position_verified_as_another_members(models, monkeypatch):
    """``we_me_sd`` with the drafter's own positions verified against the verifying member's ``p_k`` (so
    drawn from ``p_k`` instead of the drafter's own) must fail the check."""
    from pipeline.decoding.loop import Decoder
    from pipeline.decoding.sampling import probs

    def verified_as_the_member(self, k):
        start, count = self.committed, len(self.tokens) - self.committed
        self.members[k].catch_up(self.tokens, start)
        return self._settle(start, count, probs(self.members[k].span(start, start + count), self.sampling))

    monkeypatch.setattr(Decoder, "_verify_mixture", verified_as_the_member)
    setting = SETTINGS[0]
    pair = [models[0], models[2]]
    expected = exact_joint("we", pair, setting, {"weights": [0.5, 0.5]})
    counts = empirical_joint(pair, "we_me_sd", setting, method_args={"lambda": 0.5, "first_proposer": 1}, gamma=2)
    assert chi_square_pvalue(counts, expected) < ALPHA
