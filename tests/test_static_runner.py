"""The compiled engine (``static.py``): same tokens as the eager runner for every method, every
bucket compiled once up front, nothing recompiled while decoding, and the distribution audit clean."""

from __future__ import annotations

import copy
import random

import pytest
import torch

from pipeline.decoding import generate
from pipeline.decoding.audit import Audit
from pipeline.decoding.runner import set_engine
from pipeline.decoding.static import BUCKETS, StaticRunner, bucket, cache_len
from pipeline.errors import ArgumentError

from .conftest import perturbed, tiny_llama

PROMPTS = [[random.Random(i).randrange(32) for _ in range(n)] for i, n in enumerate([1, 3, 8, 17, 5, 2])]
CASES = [  # method, model indices into (target, draft, other), gamma, method_args
    ("large_model", [0], 1, {}),
    ("sd", [0, 1], 3, {}),
    ("sd", [0, 1], 5, {"proposer": "lookup+draft"}),
    ("sd", [0], 4, {"proposer": "lookup"}),
    ("we", [0, 1], 1, {"lambda": 0.4}),
    ("we_sd", [0, 1], 2, {"lambda": 0.4}),
    ("we_se", [0, 1, 2], [1, 2, 3], {}),
    ("cd_sd", [0, 1], 7, {"alpha": 0.3}),
    ("cd_se", [0, 1], [1, 4], {"alpha": 0.3, "proposer": "lookup+draft"}),
]


class CountingBackend:
    """A ``torch.compile`` backend that runs graphs eagerly, counting the graphs it was given and their calls."""

    def __init__(self):
        self.graphs = self.calls = 0

    def __call__(self, gm, example_inputs):
        self.graphs += 1

        def run(*args):
            self.calls += 1
            return gm.forward(*args)

        return run


@pytest.fixture(scope="module")
def engines():
    """Eager models and compiled copies of them (counting backend), every graph compiled up front."""
    target = tiny_llama(0, layers=2, hidden=32)
    eager = [target, perturbed(target, 0.08, seed=1), tiny_llama(2)]
    backend = CountingBackend()
    compiled = [set_engine(copy.deepcopy(m), "compiled", backend=backend) for m in eager]
    for m in compiled:
        StaticRunner(m, 32, max_len=60)
    return eager, compiled, backend


def test_every_bucket_is_compiled_up_front(engines):
    _, compiled, backend = engines
    # one graph per bucket and architecture (the target and its perturbed copy share theirs): past
    # dynamo's default limit of 8 graphs per function, where it would silently run the rest eagerly
    assert backend.graphs == len(BUCKETS) * 2 > 8


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("method,which,gamma,args", CASES)
def test_compiled_runner_emits_the_eager_runners_tokens(engines, method, which, gamma, args, temperature):
    eager, compiled, backend = engines
    before, calls = backend.graphs, backend.calls
    for prompt in PROMPTS:
        kw = dict(gamma=gamma, max_new_tokens=40, method_args=args, temperature=temperature, seed=7)
        want = generate([eager[i] for i in which], prompt, method, **kw)
        with torch._dynamo.config.patch(error_on_recompile=True):
            got = generate([compiled[i] for i in which], prompt, method, **kw)
        assert got.token_ids == want.token_ids, (method, prompt)
        assert [m.forward_calls for m in got.stats.models] == [m.forward_calls for m in want.stats.models]
    assert backend.graphs == before, "a generation compiled a new graph"
    assert backend.calls > calls + len(PROMPTS), "the compiled graphs did not run"


def test_audit_passes_over_long_outputs(engines):
    eager, compiled, _ = engines
    models = [compiled[0], compiled[1]]
    for method, gamma in [("sd", 3), ("we_se", [1, 3])]:
        result = generate(
            models, PROMPTS[3], method, gamma=gamma, max_new_tokens=120, temperature=1.0, seed=2, audit=Audit(models)
        )
        assert len(result.token_ids) == 120


def test_inductor_on_the_cpu_matches_eager():
    """The real compiler (inductor's C++ kernels) in float64: token for token the eager runner's output."""
    model = tiny_llama(5, layers=1, hidden=16)
    fast = set_engine(copy.deepcopy(model), "compiled", backend="inductor")
    for method, models, gamma, args in [
        ("large_model", [0], 1, {}),
        ("sd", [0], 3, {"proposer": "lookup"}),
        ("sd", [0, 0], 2, {}),
    ]:
        for prompt in PROMPTS[:4]:
            kw = dict(gamma=gamma, max_new_tokens=30, method_args=args, temperature=0.0)
            want = generate([model] * len(models), prompt, method, **kw)
            assert generate([fast] * len(models), prompt, method, **kw).token_ids == want.token_ids


def test_buckets_and_cache_sizes():
    assert [bucket(k) for k in (1, 2, 3, 5, 16, 17)] == [1, 2, 4, 8, 16, None]
    assert cache_len(10) == 256 and cache_len(257) == 512 and cache_len(512) == 512


def test_an_unknown_engine_is_one_line():
    with pytest.raises(ArgumentError, match="engine='fast': expected one of eager, compiled"):
        set_engine(tiny_llama(0), "fast")


def test_the_cache_refuses_to_overflow(engines):
    _, compiled, _ = engines
    runner = StaticRunner(compiled[0], 32, max_len=60)
    with torch.inference_mode(), pytest.raises(ArgumentError, match="holds 60 positions"):
        runner.extend(list(range(30)), 1)
        runner.crop(10)
        runner.extend([i % 32 for i in range(50)], 1)
        runner.extend([1], 1)
