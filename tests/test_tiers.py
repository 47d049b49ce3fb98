"""The quick tier (`make test`) keeps a representative set of each conformance test (``tiers.py``): every registered
ensemble's speculative forms (E_sd, E_se, E_me_sd, dynamic gamma, trees), ``sd`` itself and every proposer kind keep a
greedy-identity case and a chi-square case there, read from the registries; the rest run in `make test-all` (CI). A
proposer's cases come from its registration (``register_proposer(test_args=)``), never from a list in a test."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from pipeline.decoding.ensembles import conformance_ensembles
from pipeline.decoding.proposers import NAMED_PROPOSERS, conformance_proposers, parse_proposer
from pipeline.decoding.spec import DRAFT, method_names, parse_method, proposer_kinds

from .tiers import quick

ROOT = Path(__file__).resolve().parents[1]
QUICK = "not integration and not exhaustive"  # the Makefile's `make test`
# the exactness suites with greedy-identity tests (names with "greedy" or "equal") and chi-square tests ("follow")
SUITES = [
    "tests/test_greedy_lossless.py",
    "tests/test_sampling_lossless.py",
    "tests/test_sampling_new_methods.py",
    "tests/test_trees.py",
    "tests/test_proposers.py",
    "tests/test_feature_head.py",
    "tests/test_lookup.py",
]

PLUGIN = """
import json
import os


def pytest_collection_finish(session):
    with open(os.environ["QUICK_CASES"], "w") as out:
        for item in session.items:
            params = getattr(getattr(item, "callspec", None), "params", {})
            out.write(json.dumps({"test": item.originalname, "params": params}, default=repr) + "\\n")
"""


def test_the_rule_runs_each_combination_once_and_every_spread_value():
    cases = [{"case": c, "setting": s} for s in "xyz" for c in range(7)]
    kept = sorted((p for p, keep in zip(cases, quick(cases, ["setting"])) if keep), key=lambda p: p["case"])
    assert [p["case"] for p in kept] == list(range(7))  # each combination of the other parameters once
    assert [p["setting"] for p in kept] == list("xyzxyzx")  # the settings in turn, the least run first
    two = [{"case": c, "gamma": g, "n": n} for g in (1, 2, 3, 5) for n in (1, 6, 40) for c in ("a", "b")]
    kept = [p for p, keep in zip(two, quick(two, ["gamma", "n"])) if keep]
    assert {p["gamma"] for p in kept} == {1, 2, 3, 5} and {p["n"] for p in kept} == {1, 6, 40}
    assert {p["case"] for p in kept} == {"a", "b"} and len(kept) == 4  # two combinations, two more for 3 and 5
    sparse = [{"case": 0, "t": 1}, {"case": 1, "t": 1}, {"case": 1, "t": 2}]  # not a cross product
    assert quick(sparse, ["t"]) == [True, False, True]
    assert quick([{"case": [1, {"a": 2}], "t": {"k": 0}}], ["t"]) == [True]  # values need not be hashable


def walk(name, value):
    """Every (name, value) in a case's parameters: the parameters and, inside tuples, lists and dicts, their items."""
    yield name, value
    if isinstance(value, dict):
        for key, item in value.items():
            yield from walk(key, item)
    elif isinstance(value, list):
        for item in value:
            yield from walk(None, item)


SPECULATIVE = {m for m in method_names() if parse_method(m).kind in ("sd", "se", "me_sd")}


def exercised(test: str, params: dict) -> tuple[str, str | None, str, set[str]]:
    """A collected case: its check (greedy or chi-square), its speculative method, its proposer, dynamic or tree."""
    found = [pair for name, value in params.items() for pair in walk(name, value)]
    strings = [value for _, value in found if isinstance(value, str)]
    method = next((s for s in strings if s in SPECULATIVE), None)
    if {"ensemble", "variant"} <= set(params):  # test_greedy_lossless: an ensemble and a form apart
        method = params["ensemble"] + params["variant"]
    proposer = next((v for k, v in found if k in ("proposer", "kind") and isinstance(v, str)), DRAFT)
    forms = {"dynamic"} if "dynamic" in test or ("gamma_schedule", "dynamic") in found else set()
    if "tree" in test or any(k == "tree" and v is not None for k, v in found):
        forms.add("tree")
    check = "chi-square" if "follow" in test else "greedy" if "greedy" in test or "equal" in test else "other"
    return check, method, proposer, forms


def chained(kind: str, proposer: str) -> bool:
    """Whether a case's proposer stands for a kind: itself, or for ``N+draft`` any chain of N's ending in draft."""
    parts = proposer.split("+")
    return proposer == kind or ("+" in kind and kind.split("+")[0] in parts[:-1] and parts[-1] == DRAFT)


def test_the_quick_tier_has_a_greedy_and_a_chi_square_case_of_every_form_and_proposer(tmp_path):
    (tmp_path / "quick_cases_plugin.py").write_text(PLUGIN)
    out = tmp_path / "quick.jsonl"
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}", "QUICK_CASES": str(out)}
    command = [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "quick_cases_plugin"]
    command += ["-p", "no:cacheprovider", "-p", "no:randomly", "-m", QUICK, *SUITES]
    run = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0 and out.exists(), run.stdout[-2000:] + run.stderr[-2000:]
    cases = [exercised(c["test"], c["params"]) for c in map(json.loads, out.read_text().splitlines())]
    have = {"greedy": [c for c in cases if c[0] == "greedy"], "chi-square": [c for c in cases if c[0] == "chi-square"]}
    missing = []
    ensembles = conformance_ensembles()
    for method in sorted(m for m in SPECULATIVE if parse_method(m).base in ("large_model", *ensembles)):
        spec = parse_method(method)
        for check in ("greedy", "chi-square") if spec.greedy_ok else ("chi-square",):
            if not any(m == method for _, m, _, _ in have[check]):
                missing.append(f"{check}: {method}")
            for form in ("dynamic", "tree") if spec.own_loop else ():  # in some speculative method of its base
                if not any(m and parse_method(m).base == spec.base and form in f for _, m, _, f in have[check]):
                    missing.append(f"{check}: {spec.base} with {form}")
    assert set(NAMED_PROPOSERS) and set(proposer_kinds()) > {DRAFT, *NAMED_PROPOSERS}  # alone and chained
    for kind in proposer_kinds():
        for check in have:
            if not any(chained(kind, p) for _, m, p, _ in have[check] if m):
                missing.append(f"{check}: proposer {kind}")
    assert not missing, f"the quick tier ({QUICK!r}) has no case of:\n" + "\n".join(sorted(set(missing)))


def test_every_registered_proposer_has_greedy_chi_square_and_tree_cases_by_its_registration():
    """The suites' proposer cases are derived from the registry (``proposers.conformance_kinds``): every proposer
    registered with test arguments stands, alone and before the draft (itself, or in a chain that holds it), in the
    greedy-identity cases (``test_proposers.KINDS``), the chi-square cases (``test_proposers.SAMPLED``) and, where it
    branches, the trees (``test_trees.PROPOSERS``); the test above finds them collected in the quick tier."""
    from .test_proposers import KINDS, SAMPLED
    from .test_trees import PROPOSERS

    suites = {
        "greedy": KINDS,
        "chi-square": [case[4]["method_args"]["proposer"] for case in SAMPLED],
        "tree": PROPOSERS,
    }
    assert conformance_proposers()
    missing = []
    for name in conformance_proposers():
        for kind in (name, f"{name}+{DRAFT}"):
            for suite, kinds in suites.items():
                if suite == "tree" and not parse_proposer(kind).branches:
                    continue
                if not any(chained(kind, p) for p in kinds):
                    missing.append(f"{suite}: {kind}")
    assert not missing, "registered proposers without their cases:\n" + "\n".join(missing)


# ---- a proposer or an ensemble added in one file: collected by the suites, no test edited ---------------------

KEYED = [  # the suites keyed by the registries
    "tests/test_proposers.py",
    "tests/test_trees.py",
    "tests/test_audit.py",
    "tests/test_greedy_lossless.py",
    "tests/test_sampling_lossless.py",
    "tests/test_sampling_new_methods.py",
]

PROPOSER = '''"""A throwaway proposer: the context's last token again, one-hot (it can branch: one candidate)."""

from ..stats import ModelStats
from .base import NamedProposer, Proposal, ProposerTests, register_proposer


@register_proposer("repeat_last", test_args=ProposerTests(method_args={"least_reach": 0.0}))
class RepeatLast(NamedProposer):
    branches = True

    def __init__(self):
        self.stats = ModelStats()

    def draft(self, tokens, committed):
        return Proposal(tokens[-1], None, self) if tokens[-1] >= 0 else None

    def continuations(self, context, limit):
        return [context[-1]][:limit] if context[-1] >= 0 else []
'''

ENSEMBLE = '''from pipeline.decoding.ensembles import register_ensemble
from pipeline.decoding.sampling import probs


@register_ensemble("geo_mean", params={"sharpness": 1.0}, test_args={"sharpness": 1.5})
def geo_mean(logits, sampling, sharpness):
    """A throwaway ensemble: the normalised geometric mean of the members' distributions."""
    return probs(sharpness * sum(logits) / len(logits), sampling)
'''


def copy_of_the_project(where: Path) -> Path:
    """``pipeline/``, ``tests/`` and ``pyproject.toml`` copied, every other entry of the project linked."""
    where.mkdir()
    skip = shutil.ignore_patterns("__pycache__", ".pytest_cache")
    for entry in ROOT.iterdir():
        if entry.name in ("pipeline", "tests"):
            shutil.copytree(entry, where / entry.name, ignore=skip)
        elif entry.name == "pyproject.toml":  # copied: pytest's root (ids, markers) is the copy
            shutil.copy(entry, where / entry.name)
        elif entry.name not in (".git", ".venv", "results") and not entry.name.startswith((".", "results-")):
            (where / entry.name).symlink_to(entry)
    return where


def collected(copy: Path, *options: str) -> list[str]:
    """The node ids pytest collects in the copy, from a fresh process whose ``pipeline`` is the copy's."""
    env = {**os.environ, "PYTHONPATH": str(copy)}
    command = [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *options, *KEYED]
    run = subprocess.run(command, cwd=copy, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    return [line for line in run.stdout.splitlines() if "::" in line]


def test_a_new_proposer_module_and_a_new_ensemble_are_collected_by_every_suite_with_no_test_edited(tmp_path):
    """A proposer is one new module and an ensemble one new module, no test edited: dropped into a copy of the
    package (``pipeline/``, ``tests/`` and ``pyproject.toml`` copied, the rest of the project linked), each is
    collected in the quick tier by every exactness suite the registries key: the proposer by the greedy-identity
    and chi-square suites of ``test_proposers.py``, the trees of ``test_trees.py`` and the audit, with the test
    arguments it declared (``register_proposer(test_args=)``); the ensemble by the greedy, chi-square,
    dynamic-gamma, audit and tree suites. Each is a new file of its folder, which the package imports
    (``proposers.discover``, ``ensembles.discover``)."""
    copy = copy_of_the_project(tmp_path / "project")
    (copy / "pipeline" / "decoding" / "proposers" / "repeat_last.py").write_text(PROPOSER)
    (copy / "pipeline" / "decoding" / "ensembles" / "geo_mean.py").write_text(ENSEMBLE)
    for test in (copy / "tests").glob("*.py"):  # no test edited
        assert test.read_bytes() == (ROOT / "tests" / test.name).read_bytes()
    ids = collected(copy, "-m", QUICK)  # in the quick tier (`make test`), so in every tier
    expected = [  # greedy identity: alone and before the draft, in chains and trees; the chi-square check; trees
        "tests/test_proposers.py::test_greedy_outputs_equal_the_standard_methods[*-repeat_last-*]",
        "tests/test_proposers.py::test_greedy_outputs_equal_the_standard_methods[*-repeat_last+draft-*]",
        "tests/test_proposers.py::test_the_first_two_tokens_follow_the_target[sd-repeat_last-None]",
        "tests/test_proposers.py::test_the_first_two_tokens_follow_the_target[sd-repeat_last-3x1]",
        "tests/test_proposers.py::test_the_first_two_tokens_follow_the_target[we_se-repeat_last+draft-None]",
        "tests/test_trees.py::test_greedy_trees_equal_the_baseline[repeat_last-*]",
        "tests/test_trees.py::test_greedy_trees_equal_the_baseline[repeat_last+draft-*]",
    ]
    for pattern in expected:  # * : one id part (a method, a tree shape)
        if not any(re.fullmatch(re.escape(pattern).replace(r"\*", r"[^-\]]+"), i) for i in ids):
            raise AssertionError(f"no case {pattern} collected:\n" + "\n".join(i for i in ids if "repeat_last" in i))
    greedy = [i for i in ids if "test_greedy_outputs_equal_the_standard_methods" in i and "repeat_last" in i]
    assert {i.split("[")[1].split("-")[0] for i in greedy} == {"sd", "we_sd", "we_se", "cd_sd", "cd_se"}
    assert any(i.startswith("tests/test_audit.py::") and "repeat_last" in i for i in ids)  # the proposer kinds
    for suite in KEYED[1:]:  # the ensemble: every suite but the proposers' (they cross proposers with the built-ins)
        assert any(i.startswith(suite) and "geo_mean" in i for i in ids), f"{suite} does not collect geo_mean"
