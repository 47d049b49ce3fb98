"""The acceptance rule alone: exact output distributions for dense and one-hot proposals."""

from __future__ import annotations

import numpy as np
import torch

from pipeline.decoding.verify import verify_greedy, verify_sampled

TARGET = torch.tensor([0.5, 0.2, 0.2, 0.1, 0.0], dtype=torch.float64)
DRAFT = torch.tensor([0.1, 0.6, 0.1, 0.1, 0.1], dtype=torch.float64)


def output_distribution(draft_row, proposals, n=40000):
    """Propose x ~ proposals, verify against TARGET; the emitted token's empirical distribution."""
    gen = torch.Generator().manual_seed(0)
    counts = np.zeros(len(TARGET))
    xs = torch.multinomial(proposals, n, replacement=True, generator=gen)
    for x in xs.tolist():
        accepted, fix = verify_sampled(TARGET[None], torch.tensor([x]), [draft_row], gen)
        counts[x if accepted else fix] += 1
    return counts / n


def test_dense_proposal_yields_the_target():
    dist = output_distribution(DRAFT, DRAFT)
    assert np.abs(dist - TARGET.numpy()).max() < 0.01
    assert dist[4] == 0  # a token the target forbids never comes out


def test_one_hot_proposal_yields_the_target():
    for token in range(4):
        one_hot = torch.zeros(5, dtype=torch.float64)
        one_hot[token] = 1
        dist = output_distribution(None, one_hot, n=20000)
        assert np.abs(dist - TARGET.numpy()).max() < 0.012, token


def test_block_stops_at_first_rejection():
    target = torch.eye(4, dtype=torch.float64)[[0, 1, 2]]  # the target is certain: tokens 0, 1, 2
    accepted, fix = verify_sampled(target, torch.tensor([0, 3, 2]), [None, None, None], torch.Generator())
    assert (accepted, fix) == (1, 1)
    assert verify_greedy(torch.tensor([4, 5, 6]), torch.tensor([4, 5, 6])) == (3, None)
    assert verify_greedy(torch.tensor([4, 5, 6]), torch.tensor([4, 9, 6])) == (1, 5)
