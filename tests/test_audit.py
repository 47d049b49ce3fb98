"""The distribution audit: every method and proposer over long outputs, and proof that it can fail.

The chi-square test (``test_sampling_lossless.py``) sees the first two tokens
only. Here every distribution the decoder samples from or verifies against,
over 110 tokens, is recomputed from scratch in float64 (``decoding/audit.py``)
for every built-in method, each proposer kind, greedy and sampling.
"""

from __future__ import annotations

import pytest

from pipeline.decoding import generate
from pipeline.decoding.audit import Audit, AuditError
from pipeline.decoding.ensembles import conformance_ensembles
from pipeline.decoding.member import Member
from pipeline.decoding.proposers.feature import attach
from pipeline.decoding.runner import HFRunner
from pipeline.decoding.spec import method_names, parse_method
from pipeline.models.feature_head import FeatureHead

from .conftest import perturbed, tiny_llama

N = 110
PROMPT = [3, 1, 4, 1, 5, 9, 2, 6, 3, 1, 4, 1]  # repeats: prompt lookup has matches from the start
SETTINGS = {"greedy": {}, "sampling": {"temperature": 0.9, "top_k": 20, "top_p": 0.95}}
ARGS = conformance_ensembles()  # every registered ensemble, with the arguments it declared for these tests
ARGS["we"] = {"weights": [0.5, 0.3, 0.2]}  # and the built-in mixture over three models of other weights
SE_GAMMA = [2, 3, 1]
# the built-in ensembles: ones registered by other tests may round on purpose (ties), beyond any tolerance;
# not transformers' own methods (tests/test_peers.py), which run none of our code
METHODS = [
    m
    for m in method_names()
    if parse_method(m).base in ("large_model", "small_model", *ARGS) and parse_method(m).kind != "peer"
]
CASES = [
    (method, proposer, setting)
    for method in METHODS
    for proposer in (parse_method(method).proposer_kinds or [None])
    for setting in SETTINGS
    if setting != "greedy" or parse_method(method).greedy_ok  # a mixture draw has no greedy form
]


@pytest.fixture(scope="module")
def trio():
    target = tiny_llama(80, layers=2, hidden=32)
    attach(target, FeatureHead(target, None))  # the eagle proposer's head (random: it proposes, often wrongly)
    return [target, perturbed(target, 0.1, seed=81), tiny_llama(82)]


def audited(trio, method, proposer=None, setting="greedy", n=N, seed=0, start=None, **kw):
    spec = parse_method(method)
    models = trio if spec.base == "we" else trio[:2]  # a registered ensemble: two models (its least)
    args = dict(ARGS.get(spec.base, {}))
    if proposer is not None:
        args["proposer"] = proposer
    gamma = SE_GAMMA[: len(models)] if spec.kind == "se" else 3
    if start is not None:  # one starting gamma for every proposer
        gamma = [start] * len(models) if spec.kind == "se" else start
    audit = Audit(models)
    out = generate(
        models, PROMPT, method, gamma, n, method_args=args, seed=seed, audit=audit, **SETTINGS[setting], **kw
    )
    return out, audit


@pytest.mark.spread("proposer")  # make test: each method and setting with one proposer, the proposers in turn
@pytest.mark.parametrize("method,proposer,setting", CASES, ids=["-".join(map(str, c)) for c in CASES])
def test_every_distribution_matches_a_recompute_from_scratch(trio, method, proposer, setting):
    out, audit = audited(trio, method, proposer, setting)
    assert len(out.token_ids) == N
    assert audit.checked >= N  # every emitted token was drawn from or verified against an audited target
    for named in ("lookup", "eagle"):
        if proposer is not None and named in proposer:
            assert out.stats.proposers[named].proposed > 0


def test_every_built_in_method_is_audited():
    assert {parse_method(m).kind for m in METHODS} == {"plain", "parallel", "sd", "se", "me", "me_sd"}
    assert {parse_method(m).base for m in METHODS} == {"large_model", "small_model", *conformance_ensembles()}
    assert {"we", "cd", "gac"} <= set(conformance_ensembles())


@pytest.mark.spread("setting")  # make test: each method greedy or sampling, in turn
@pytest.mark.parametrize("method", ["sd", "we_sd", "we_se", "cd_se", "gac_se"])
@pytest.mark.parametrize("setting", SETTINGS)
def test_dynamic_gamma_every_distribution_matches_a_recompute(trio, method, setting):
    out, audit = audited(trio, method, "draft", setting, start=1, gamma_schedule="dynamic")
    assert len(out.token_ids) == N and audit.checked >= N
    assert len(out.stats.position_verified) > 1, "some round should draft more than the starting gamma"


def crop_off_by_one_deep(self, length):
    """A cache crop that keeps one stale entry when it discards two tokens or more past position 60."""
    if length < self.length:
        stale = 1 if length >= 60 and self.length - length > 1 else 0
        self.cache.crop(length - self.length + stale)  # a negative count removes that many tokens
        self.length = length


def catch_up_feeding_a_token_twice_deep(self, tokens, committed, catch_up=Member.catch_up):
    """A lazy catch-up that, past position 60, feeds the last token it saw once more before the new ones."""
    seen = self.runner.length
    if seen >= 60 and len(tokens) - seen > 1:
        self.runner.extend(tokens[seen - 1 : seen], 1)
        self.runner.length = seen
    catch_up(self, tokens, committed)


BUGS = {
    "crop": (HFRunner, "crop", crop_off_by_one_deep),
    "catch_up": (Member, "catch_up", catch_up_feeding_a_token_twice_deep),
}


@pytest.mark.parametrize(
    "method,proposer,bug,setting",
    [("sd", "draft", bug, setting) for bug in BUGS for setting in SETTINGS]
    + [("we_me", None, "catch_up", "sampling")]  # the mixture's lazy catch-up (it never crops)
    + [("we_me_sd", "draft", bug, "sampling") for bug in BUGS],
)
def test_the_audit_catches_an_injected_bug(trio, monkeypatch, method, proposer, bug, setting):
    early = audited(trio, method, proposer, setting, n=40)[0].token_ids
    monkeypatch.setattr(*BUGS[bug])
    assert audited(trio, method, proposer, setting, n=40)[0].token_ids == early  # it shows only deep into the output
    with pytest.raises(AuditError, match="differs from a recompute from scratch"):
        audited(trio, method, proposer, setting)
