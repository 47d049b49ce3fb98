"""The one cost model (pipeline/measure/cost.py): a chain's forecast, a tree round's prediction and the prediction
from a run's counted forwards are one formula, so each agrees with the others where their inputs coincide."""

from __future__ import annotations

import pytest

from pipeline.measure import cost


@pytest.mark.parametrize("a", [0.0, 0.3, 0.7, 1.0])
@pytest.mark.parametrize("gamma", [1, 3, 5])
def test_a_chain_is_a_tree_round_of_one_branch(a, gamma):
    target, draft = (0.02, 0.003), (0.004, 0.0005)  # seconds: a + b k for a forward of k new tokens
    timed_target = {k: target[0] + target[1] * k for k in range(1, 9)}
    chain = cost.chain_speedup(a, gamma, timed_target, {1: sum(draft)})
    tree = cost.round_speedup(cost.expected_tokens(a, gamma), gamma, gamma, 1, target, draft)
    assert chain == pytest.approx(tree, rel=1e-12)
    assert cost.expected_tokens(a, gamma) == pytest.approx(sum(a**i for i in range(gamma + 1)))


def test_counted_forwards_predict_what_the_round_model_does_at_constant_costs():
    """A run of R rounds of γ drafts emitting τ tokens each, priced at the baseline's measured cost per forward,
    predicts τ c_t / (c_t + γ c_d): the round model with costs that do not grow with the tokens fed."""
    rounds, gamma, tau, c_t, c_d = 40, 3, 2.5, 0.02, 0.004
    tokens = int(rounds * tau)
    method = {"new_tokens": tokens, "models": [{"forward_calls": rounds, "forward_time_s": 9.0}]}
    method["models"].append({"forward_calls": gamma * rounds, "forward_time_s": 9.0})
    baseline = {"new_tokens": tokens, "models": [{"forward_calls": tokens, "forward_time_s": c_t * tokens}]}
    baseline["models"].append({"forward_calls": 0, "forward_time_s": 0.0})
    method["models"][1]["forward_time_s"] = c_d * gamma * rounds  # the draft's cost comes from the method's run
    rows = [{"stats": method, "baseline": {"stats": baseline}}]
    expected = cost.round_speedup(tau, gamma, gamma, 1, (c_t, 0.0), (c_d, 0.0))
    assert cost.predicted_speedup(rows) == pytest.approx(expected, rel=1e-12)
    assert cost.predicted_speedup([{"stats": method}]) is None  # no baseline, no prediction
