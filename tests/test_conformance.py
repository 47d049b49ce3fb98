"""The exactness suites are keyed by the registries: an ensemble or a proposer registered in a fresh process (a
pytest plugin here, a user's module in practice) is collected by every suite with no test file edited, and one
that is wrong on purpose fails them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SUITES = [
    "tests/test_greedy_lossless.py",
    "tests/test_sampling_lossless.py",
    "tests/test_sampling_new_methods.py",
    "tests/test_audit.py",
    "tests/test_trees.py",
]

PLUGIN = '''
import os

from pipeline.decoding import register_ensemble
from pipeline.decoding.proposers import NamedProposer, register_proposer
from pipeline.decoding.sampling import probs
from pipeline.decoding.stats import ModelStats


@register_ensemble("geo_mean", params={"sharpness": 1.0}, test_args={"sharpness": 1.5})
def geo_mean(logits, sampling, sharpness):
    """A normalised geometric mean of the members' distributions: exact under every speculative form."""
    return probs(sharpness * sum(logits) / len(logits), sampling)


@register_ensemble("block_mixed")
def block_mixed(logits, sampling):
    """Wrong on purpose: each row's target reads the other rows of its block, so verifying k tokens at once
    gives another r than decoding them one by one."""
    return probs(logits[0] + logits[0].mean(dim=0, keepdim=True), sampling)


def pytest_collection_modifyitems(config, items):
    """Write every collected test's id to a file, then run only the chosen ones."""
    with open(os.environ["COLLECTED"], "w") as out:
        out.write("\\n".join(item.nodeid for item in items))
    chosen = os.environ["CHOSEN"].split()
    config.hook.pytest_deselected(items=[i for i in items if i.nodeid not in chosen])
    items[:] = [i for i in items if i.nodeid in chosen]


@register_proposer("never")
class Never(NamedProposer):
    """Proposes nothing: the target's own tokens every round."""

    def __init__(self):
        self.stats = ModelStats()

    def draft(self, tokens, committed):
        return None
'''


CASE = "tests/test_greedy_lossless.py::test_two_model_ensembles_equal_standard_ensemble[{}-{}-{}]"
RIGHT = [CASE.format(1, "_se", "geo_mean")]  # one case each: the suites' own runs cover the rest
WRONG = [CASE.format(0, "_sd", "block_mixed")]


def test_registered_ensembles_and_proposers_are_under_every_suite_and_a_wrong_one_fails(tmp_path):
    (tmp_path / "conformance_plugin.py").write_text(PLUGIN)
    collected = tmp_path / "collected.txt"
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}", "COLLECTED": str(collected)}
    env["CHOSEN"] = " ".join(RIGHT + WRONG)
    command = [sys.executable, "-m", "pytest", "-p", "conformance_plugin", "-p", "no:cacheprovider", "-q", *SUITES]
    run = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert collected.exists(), run.stdout[-2000:] + run.stderr[-2000:]
    ids = collected.read_text().splitlines()
    for suite in SUITES:  # collected by every suite, no test file edited
        assert any(i.startswith(suite) and "geo_mean" in i for i in ids), f"{suite} does not collect it"
    assert any("test_audit.py" in i and "never" in i for i in ids), "the audit does not collect the proposer"
    assert set(RIGHT + WRONG) <= set(ids)
    assert run.returncode == 1, run.stdout[-2000:] + run.stderr[-2000:]
    failed = sorted(line.split()[1] for line in run.stdout.splitlines() if line.startswith("FAILED"))
    assert failed == sorted(WRONG), run.stdout[-2000:]  # the right one passes, the wrong one fails
