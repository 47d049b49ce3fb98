"""Token trees (``decoding/tree.py``, ``tree/verify.py``): exact for every speculative method.

Greedy: every method with a static and a dynamic tree and each proposer kind
emits its baseline's tokens. Sampling: the first two tokens follow the exact
joint (the reference and chi-square check of ``test_sampling_lossless.py``),
children drawn with and without replacement, and the check rejects a planted
wrong residual. The audit recomputes every distribution over 110 tokens and
catches a planted stale-cache compaction that leaves the first tokens right.
"""

from __future__ import annotations

import copy
import functools

import numpy as np
import pytest
import torch

from pipeline.decoding import generate
from pipeline.decoding.audit import Audit, AuditError
from pipeline.decoding.ensembles import ENSEMBLES, conformance_ensembles
from pipeline.decoding.proposers import conformance_kinds, parse_proposer
from pipeline.decoding.spec import method_names, parse_method
from pipeline.decoding.tree import cache as tree_cache
from pipeline.decoding.tree import verify as tree_verify
from pipeline.decoding.tree.loop import Tree, parse_tree
from pipeline.errors import ArgumentError

from .conftest import perturbed, tiny_llama, without_null
from .test_cell import Repeat
from .test_sampling_lossless import ALPHA, VOCAB, chi_square_pvalue, exact_joint, make_models, reference

ARGS = conformance_ensembles()  # every registered ensemble, with the arguments it declared for these tests
SPECULATIVE = [
    m for m in method_names() if parse_method(m).kind in ("sd", "se") and parse_method(m).base != "small_model"
]
SPECULATIVE = [m for m in SPECULATIVE if parse_method(m).base in ("large_model", *ARGS)]
PROMPTS = [[3, 1, 4, 1, 5, 9, 2, 6, 3, 1, 4], [2, 2, 5, 2, 2, 5, 2]]
TREES = [([3, 2, 1], "fixed"), ("d8", "dynamic"), ([2, 1, 2], "dynamic")]  # static, dynamic; fixed, dynamic gamma
# the draft model and every registered proposer that branches (``register_proposer(test_args=)``), alone and before
# the draft as it declared: registering one puts it under the trees, no test edited
KINDS = {
    k.kind: dict(k.method_args) for k in conformance_kinds() if k.role != "chain" and parse_proposer(k.kind).branches
}
PROPOSERS = ["draft", *KINDS]


def test_tree_shapes_parse_and_refuse_in_one_line():
    assert parse_tree([3, 2, 1]).nodes == 3 + 6 + 6 and parse_tree([3, 2, 1]).label == "t3x2x1"
    assert parse_tree("td16w").label == "td16w" and not parse_tree("d16w").replacement and parse_tree(16).nodes == 16
    assert parse_tree("2x2") == parse_tree([2, 2]) and parse_tree(None) is None
    for bad in ("3x", [0, 2], 0, 65, [8, 8, 8], "wide", 2.5, "9" * 5001, "d" + "9" * 5001):  # no 5,000-digit int
        with pytest.raises(ArgumentError, match="tree="):
            parse_tree(bad)


def test_trees_are_refused_where_they_cannot_run(trio):
    target, draft, _ = trio
    with pytest.raises(ArgumentError, match="a tree is for the sd"):
        generate([target, draft], [1, 2], "we", max_new_tokens=2, method_args={"lambda": 0.5}, tree=[2])
    with pytest.raises(ArgumentError, match="tree="):
        generate([target, draft], [1, 2], "sd", max_new_tokens=2, tree="bushy")
    windowed = copy.deepcopy(target)
    windowed.config.sliding_window, windowed.config.layer_types = 4, ["sliding_attention", "full_attention"]
    with pytest.raises(ArgumentError, match="model 0 has sliding-window layers"):
        generate([windowed, draft], [1, 2], "sd", max_new_tokens=2, tree=[2])


@functools.cache
def headed(models: tuple) -> list:
    """The models, the first a copy with a random feature head attached, for a proposer that drafts from the
    target's features (``reads_features``: ``eagle``'s head)."""
    from pipeline.decoding.proposers.feature import attach
    from pipeline.models.feature_head import FeatureHead

    target = copy.deepcopy(models[0])
    torch.manual_seed(0)
    head = FeatureHead(target, None)
    with torch.no_grad():
        head.fc.weight.mul_(4)  # peaked: it proposes, sometimes rightly
    return [attach(target, head), *models[1:]]


@pytest.mark.spread("proposer")  # make test: each method with one proposer, the proposers in turn (tests/tiers.py)
@pytest.mark.parametrize("method", SPECULATIVE)
@pytest.mark.parametrize("proposer", PROPOSERS)
def test_greedy_trees_equal_the_baseline(trio, method, proposer):
    spec = parse_method(method)
    trio = headed(tuple(trio)) if parse_proposer(proposer).reads_features else trio
    models = list(trio[:2]) if spec.kind == "sd" and spec.ensemble is None else list(trio)
    if spec.ensemble is not None and spec.ensemble.max_models == 2:
        models = models[:2]
    args = {k: v for k, v in ARGS.get(spec.base, {}).items() if len(models) == 2 or k != "lambda"}
    args |= KINDS.get(proposer, {})
    baseline = "large_model" if spec.ensemble is None else spec.base
    accepted = 0
    for prompt in PROMPTS:
        base = generate(models, prompt, baseline, max_new_tokens=30, method_args=args).token_ids
        for tree, schedule in TREES:
            out = generate(
                models,
                prompt,
                method,
                gamma=3,
                max_new_tokens=30,
                method_args={**args, "proposer": proposer},
                tree=tree,
                gamma_schedule=schedule,
            )
            assert out.token_ids == base, (prompt, tree, schedule)
            assert out.method_args["tree"] == parse_tree(tree).label
            accepted += out.stats.accepted
    assert accepted > 0


def test_a_tree_needs_fewer_target_forwards_than_a_chain_of_its_depth(trio):
    target, draft, _ = trio
    prompt, n = PROMPTS[0], 60
    chain = generate([target, draft], prompt, "sd", gamma=3, max_new_tokens=n).stats
    tree = generate([target, draft], prompt, "sd", gamma=3, max_new_tokens=n, tree=[4, 2, 1]).stats
    assert tree.tau > chain.tau and tree.tree_nodes > 0
    assert draft_forwards(tree) <= draft_forwards(chain)  # one drafter forward per depth, as for a chain


def draft_forwards(stats) -> int:
    return stats.models[1].forward_calls


def test_lookup_branches_are_the_distinct_continuations_of_its_matches():
    from pipeline.decoding.proposers.lookup import PromptLookup

    lookup = PromptLookup()
    tokens = [5, 6, 1, 5, 6, 2, 5, 6, 1, 9, 5, 6]
    found = lookup.continuations(tokens, 4)
    assert found[0] == lookup.propose(tokens) == 1 and found == [1, 2]


def test_greedy_acceptance_follows_the_targets_argmax():
    tree = Tree()
    for token in (2, 0):
        tree.add(-1, token, None, 1.0, None)
    tree.add(1, 3, None, 1.0, None)  # node 2: under token 0
    target = torch.zeros(4, 4)
    target[0, 0] = target[2, 3] = target[3, 1] = 1.0  # root -> 0, node 1 (token 0) -> 3, node 2 (leaf) -> 1
    assert tree_verify.accept_tree(tree, target, True, None) == ([1, 2], 1)
    target[2] = 0.0
    target[2, 2] = 1.0  # node 1's argmax 2 is not among its children: the correction
    assert tree_verify.accept_tree(tree, target, True, None) == ([1], 2)


# ---- sampling: the first two tokens against the exact joint -----------------------------------

N = 1000
SETTING = {"temperature": 1.0, "top_k": 0, "top_p": 1.0}
SAMPLED = [
    # (method, model indices, reference kind, reference args, generate kwargs)
    ("sd", [0, 1], "single", {}, {}),
    ("we_sd", [0, 1], "we", {"weights": [0.5, 0.5]}, {"method_args": {"lambda": 0.5}}),
    ("we_se", [0, 1], "we", {"weights": [0.5, 0.5]}, {"method_args": {"lambda": 0.5}}),
    ("cd_se", [0, 1], "cd", {"alpha": 0.3}, {"method_args": {"alpha": 0.3, "first_proposer": 0}}),
]


@pytest.fixture(scope="module")
def small():
    return make_models()


def tree_joint(models, method, tree, seeds=N, **kw) -> np.ndarray:
    counts = np.zeros((VOCAB, VOCAB))
    for seed in range(seeds):
        out = generate(models, [1, 4, 2], method, gamma=2, max_new_tokens=2, seed=seed, tree=tree, **SETTING, **kw)
        counts[out.token_ids[0], out.token_ids[1]] += 1
    return counts


# children drawn with replacement (3x2) and without (w), static and dynamic (d4w)
TREE_CASES = [(0, "3x2"), (0, "3x2w"), (1, "3x2w"), (2, "3x2"), (2, "d4w"), (3, "3x2w")]
# a tree in every other registered ensemble (``register_ensemble``), with the arguments it declared for these tests
SAMPLED += [
    (name + "_sd", [0, 1], *reference(name, args), {"method_args": args})
    for name, args in ARGS.items()
    if name not in ("we", "cd") and ENSEMBLES[name].min_models <= 2
]
TREE_CASES += [(i, "3x2w") for i in range(4, len(SAMPLED))]


@pytest.mark.parametrize(
    "case,tree", [(SAMPLED[i], t) for i, t in TREE_CASES], ids=[f"{SAMPLED[i][0]}-{t}" for i, t in TREE_CASES]
)
def test_first_two_tokens_follow_the_target_with_trees(small, case, tree):
    method, idx, kind, ref_args, kw = case
    chosen = [small[i] for i in idx]
    expected = exact_joint(kind, chosen, SETTING, ref_args)
    p = chi_square_pvalue(tree_joint(chosen, method, tree, **kw), expected)
    assert p > ALPHA, f"{method} with tree {tree}: chi-square p={p:.2e}"


def test_the_tree_check_rejects_a_wrong_residual(small, monkeypatch):
    """A residual that forgets to subtract the draft (``r`` instead of ``max(0, r - q)``) must fail."""
    chosen = small[:2]
    expected = exact_joint("single", chosen, SETTING, {})
    monkeypatch.setattr(tree_verify, "residual", lambda r, q, token: r)
    assert chi_square_pvalue(tree_joint(chosen, "sd", "3x2"), expected) < ALPHA


def test_the_tree_check_rejects_without_replacement_judged_as_with(small, monkeypatch):
    """Children drawn without replacement but accepted against the plain ``q`` (not renormalised) must fail."""
    chosen = small[:2]
    expected = exact_joint("single", chosen, SETTING, {})
    add = Tree.add

    def plain_q(self, parent, token, q, cum, by):
        add(self, parent, token, None if q is None else self.q.get(parent, q), cum, by)

    monkeypatch.setattr(Tree, "add", plain_q)
    assert chi_square_pvalue(tree_joint(chosen, "sd", "4w"), expected) < ALPHA


# ---- the audit over long outputs ------------------------------------------------------------


@pytest.fixture(scope="module")
def audit_trio():
    from pipeline.decoding.proposers.feature import attach
    from pipeline.models.feature_head import FeatureHead

    target = tiny_llama(80, layers=2, hidden=32)
    attach(target, FeatureHead(target, None))  # the eagle proposer's head (random: it proposes, often wrongly)
    return [target, perturbed(target, 0.1, seed=81), tiny_llama(82)]


AUDITED = [
    ("sd", "draft", "3x2x1"),
    ("sd", "lookup+draft", "d8w"),
    ("we_sd", "draft", "d8"),
    ("we_se", "lookup+draft", "3x2x1w"),
    ("cd_se", "draft", "d8w"),
    ("sd", "eagle", "d8w"),  # the feature head's distributions at every node, recomputed from scratch
    ("we_se", "eagle+draft", "3x2x1"),
]
AUDIT_PROMPT = [3, 1, 4, 1, 5, 9, 2, 6, 3, 1, 4, 1]


def audited(models, method, proposer, tree, n=110, temperature=0.9, **kw):
    spec = parse_method(method)
    models = models if spec.base == "we" else models[:2]
    args = {"we": {"weights": [0.5, 0.3, 0.2]}, "cd": {"alpha": 0.3, "beta": 0.05}}.get(spec.base, {})
    audit = Audit(models)
    out = generate(
        models,
        AUDIT_PROMPT,
        method,
        gamma=2,
        max_new_tokens=n,
        temperature=temperature,
        top_k=20,
        method_args={**args, "proposer": proposer},
        audit=audit,
        tree=tree,
        **kw,
    )
    return out, audit


@pytest.mark.parametrize("method,proposer,tree", AUDITED)
def test_every_tree_distribution_matches_a_recompute(audit_trio, method, proposer, tree):
    out, audit = audited(audit_trio, method, proposer, tree, gamma_schedule="dynamic")
    assert len(out.token_ids) == 110 and audit.checked > 110
    assert out.stats.tree_nodes > 0
    for named in ("lookup", "eagle"):
        if named in proposer:
            assert out.stats.proposers[named].proposed > 0


def compact_without_gather(runner, start, keep):
    """A compaction that, past position 60, crops without moving the accepted path's K/V into place: the
    cache then holds the first nodes fed (siblings, not the path)."""
    if start < 60:
        return ORIGINAL_COMPACT(runner, start, keep)
    runner.crop(start + len(keep))


ORIGINAL_COMPACT = tree_cache.compact


def test_the_audit_catches_a_stale_compaction(audit_trio, monkeypatch, temperature=0.9):
    early = audited(audit_trio, "sd", "draft", "3x2x1", n=40, temperature=temperature)[0].token_ids
    monkeypatch.setattr(tree_cache, "compact", compact_without_gather)
    assert audited(audit_trio, "sd", "draft", "3x2x1", n=40, temperature=temperature)[0].token_ids == early
    with pytest.raises(AuditError, match="differs from a recompute from scratch"):
        audited(audit_trio, "sd", "draft", "3x2x1", temperature=temperature)


# ---- the config ---------------------------------------------------------------------------


def test_config_trees_become_cells_beside_the_chain():
    from pipeline.experiment.config import ConfigError, check_config
    from pipeline.experiment.grid import expand_cells

    base = {
        "models": {"big": {}, "small": {}},
        "grids": [{"name": "g", "model_sets": {"pair": ["big", "small"]}, "methods": ["we", "sd", "we_se"]}],
        "gamma": [3],
    }
    cells = expand_cells(check_config({**base, "tree": [None, [3, 2, 1], 16]}))
    assert without_null(cells) == [
        "humaneval/pair/sd-T0-g3",
        "humaneval/pair/sd-T0-g3-t3x2x1",
        "humaneval/pair/sd-T0-g3-td16",
        "humaneval/pair/we-T0",
        "humaneval/pair/we_se-T0-g1-3",
        "humaneval/pair/we_se-T0-g1-3-t3x2x1",
        "humaneval/pair/we_se-T0-g1-3-td16",
    ]
    tree = cells["humaneval/pair/sd-T0-g3-t3x2x1"]
    assert tree.cell.tree == "t3x2x1" and tree.dims.tree_nodes == 15
    assert tree.dims.gamma == "3 t3x2x1 (15 nodes)" and "tree" not in cells["humaneval/pair/sd-T0-g3"].cell.to_json()
    with pytest.raises(ConfigError, match=r"grid 'g': config key tree='bushy': expected"):
        expand_cells(check_config({**base, "tree": ["bushy"]}))


def test_a_cell_refuses_a_tree_for_a_method_without_one():
    from pipeline.errors import UserError
    from pipeline.experiment.cell import Cell

    assert Cell.from_json({"models": ["m"], "method": "sd", "task": "humaneval", "tree": "3x2"}).tree == "3x2"
    with pytest.raises(UserError, match="a tree is for the sd"):
        Cell.from_json({"models": ["m"], "method": "we", "task": "humaneval", "tree": "3x2"})


# ---- the benchmark rows and the cost model ------------------------------------------------------


def test_bench_rows_put_each_tree_beside_the_chain_of_its_node_budget():
    from pipeline.bench.variants import same_budget_chain, select, variants

    vs = select(variants([1], "draft", dynamic=[], trees=["3x2x1", "d8"]), ["sd", "we"], ["sd", "we_se"])
    labels = [v.label for v in vs]
    assert {"sd g=15", "sd t3x2x1", "sd g=8", "sd td8", "we_se g=[1,15]", "we_se t3x2x1"} <= set(labels)
    tree = next(v for v in vs if v.label == "we_se t3x2x1")
    assert tree.tree == "t3x2x1" and same_budget_chain(tree, vs).label == "we_se g=[1,15]"
    assert same_budget_chain(next(v for v in vs if v.label == "sd g=1"), vs) is None


def test_a_sweep_of_proposers_runs_each_speculative_variant_once_with_each():
    """Several proposers: every speculative variant (chains, dynamic, trees) once per proposer, labelled by it, each
    tree beside its own proposer's chain and each dynamic variant against its own proposer's fixed gammas; the
    baselines and transformers' methods once."""
    from pipeline.bench.table import best_fixed
    from pipeline.bench.variants import same_budget_chain, select, variants

    vs = select(variants([1, 3], ["lookup+draft", "eagle"], dynamic=[1], trees=["2x1"]), ["sd", "we"], None)
    labels = [v.label for v in vs]
    assert len(labels) == len(set(labels)) and labels.count("large_model") == labels.count("we") == 1
    for p in ("lookup+draft", "eagle"):
        mine = [v for v in vs if v.label.endswith(f"[{p}]")]
        assert {v.method_args["proposer"] for v in mine} == {p}
        assert {f"sd g=1 [{p}]", f"sd g=3 [{p}]", f"sd dyn g=1 [{p}]", f"sd t2x1 [{p}]", f"we_se g=[1,3] [{p}]"} <= {
            v.label for v in mine
        }
        tree = next(v for v in mine if v.label == f"sd t2x1 [{p}]")
        assert same_budget_chain(tree, vs).label == f"sd g=4 [{p}]"  # 2x1: 4 nodes, a chain of 4 beside it
        totals = {v.label: type("T", (), {"tokens": 10, "wall": 2.0 if "eagle" in v.label else 1.0})() for v in vs}
        dyn = next(v for v in mine if v.label == f"sd dyn g=1 [{p}]")
        assert best_fixed(dyn, vs, totals).label.endswith(f"[{p}]")
    assert "hf_assisted g=3" in labels and not any("hf_" in v.label and "[" in v.label for v in vs)
    assert [v.label for v in variants([1], "draft")] == [v.label for v in variants([1], ["draft"])]  # one: no tag


def test_the_cost_model_prices_nodes_at_the_fitted_per_token_cost():
    from pipeline.measure import cost

    # forwards of 1, 3 and 5 tokens: a = 10 ms, b = 2 ms per token
    assert cost.fit({1: 12.0, 3: 16.0, 5: 20.0}) == (10.0, 2.0)
    free = (0.010, 0.0)
    # nodes free, no draft cost: the speed-up is τ
    assert cost.round_speedup(2.5, 15, 3, 3, free, (0.0, 0.0)) == 2.5
    dear = (0.010, 0.002)
    assert cost.round_speedup(2.5, 15, 3, 3, dear, (0.0, 0.0)) < cost.round_speedup(2.5, 3, 3, 1, dear, (0, 0))
    need = cost.tau_needed(1.35, 15, 3, 3, dear, (0.001, 0.0))
    assert abs(cost.round_speedup(need, 15, 3, 3, dear, (0.001, 0.0)) - 1.35) < 1e-12
    rows = [
        {"label": "chain", "tau": 1.8, "nodes": 3, "depth": 3, "width": 1},
        {"label": "tree", "tau": 2.6, "nodes": 15, "depth": 3, "width": 3},
    ]
    assert cost.best_budget(rows, free, (0.001, 0.0))["best"]["label"] == "tree"
    assert cost.best_budget(rows, (0.010, 0.004), (0.001, 0.0))["best"]["label"] == "chain"


# ---- proposers registered by users take part in trees through the protocol, or are refused ----------------------


class Single(Repeat):
    """A proposer with neither optional method: it drafts chains only."""


class Echo(Single):
    """One-hot candidates (``continuations``): the context's last distinct tokens, latest first."""

    def continuations(self, context, limit):
        return list(dict.fromkeys(reversed(context)))[:limit]


class Unigram(Single):
    """A distribution of its own (``logits``): fixed scores, the same after every context."""

    def logits(self, context):
        return torch.linspace(2.0, -2.0, VOCAB, dtype=torch.float64)


@pytest.fixture
def registered():
    from pipeline.decoding.proposers import NAMED_PROPOSERS, register_proposer

    for name, cls in (("echo", Echo), ("unigram", Unigram), ("single", Single)):
        register_proposer(name)(cls)
    yield
    for name in ("echo", "unigram", "single"):
        NAMED_PROPOSERS.pop(name)


@pytest.mark.spread("tree")  # make test: each proposer with one shape, in turn
@pytest.mark.parametrize("proposer", ["echo", "echo+draft", "unigram", "unigram+draft"])
@pytest.mark.parametrize("tree", ["3x2", "d6"])
def test_a_registered_proposer_drafts_trees_through_the_protocol(small, registered, proposer, tree):
    """Alone it fills the tree (not an empty tree with the target's token alone); with a draft, its candidates
    come first (``continuations``) or its distribution replaces the draft's (``logits``); greedy stays exact."""
    name = proposer.split("+")[0]
    for prompt in ([1, 4, 2, 1, 4, 3, 1, 4], [5, 0, 5, 0, 2]):
        base = generate(small[:2], prompt, "large_model", max_new_tokens=24).token_ids
        out = generate(small[:2], prompt, "sd", 3, 24, method_args={"proposer": proposer}, tree=tree)
        assert out.token_ids == base
        ours = out.stats.proposers[name]
        assert ours.proposed > out.stats.rounds  # several candidates per round: it drafted the tree
        if name == "unigram":  # its distribution, not the draft's: the draft model never drafts
            assert out.stats.models[1].forward_calls == 0
    joint = tree_joint(small[:1], "sd", tree, seeds=300, method_args={"proposer": "unigram"})
    assert chi_square_pvalue(joint, exact_joint("single", small[:1], SETTING, {})) > ALPHA


def test_a_registered_proposer_without_candidates_is_refused_in_a_tree(small, registered):
    says = "a token tree with proposer 'single', which drafts one candidate per position and cannot draft"
    with pytest.raises(ArgumentError, match=says):
        generate(small[:2], [1, 4, 2], "sd", 3, 8, method_args={"proposer": "single+draft"}, tree="3x2")
    chain = generate(small[:2], [1, 4, 2], "sd", 3, 8, method_args={"proposer": "single+draft"})
    assert chain.token_ids == generate(small[:2], [1, 4, 2], "large_model", max_new_tokens=8).token_ids
