"""The compiled runner (``static.py``): same tokens as the eager runner for every method, every
bucket compiled once up front, nothing recompiled while decoding, and the distribution audit clean."""

from __future__ import annotations

import copy
import random

import pytest
import torch

from pipeline.decoding import generate
from pipeline.decoding.audit import Audit
from pipeline.decoding.runner import as_rows, runner_of, set_runner
from pipeline.decoding.spec import parse_method
from pipeline.decoding.static import BUCKETS, StaticRunner, bucket, cache_len
from pipeline.errors import ArgumentError
from pipeline.models import ModelError, ModelSpec, cpu_kernels, load_spec
from pipeline.models.cpu_kernels import PackedLinear

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
    ("we_p", [0, 1], 1, {"lambda": 0.4}),  # members forwarded from threads
    ("we_me", [0, 1, 2], 1, {}),  # lazy catch-up: forwards of every length
    ("we_me_sd", [0, 1], 3, {"lambda": 0.6}),
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
def runners():
    """Eager models and compiled copies of them (counting backend), every graph compiled up front."""
    target = tiny_llama(0, layers=2, hidden=32)
    eager = [target, perturbed(target, 0.08, seed=1), tiny_llama(2)]
    backend = CountingBackend()
    compiled = [set_runner(copy.deepcopy(m), "compiled", backend=backend) for m in eager]
    for m in compiled:
        StaticRunner(m, 32, max_len=60)
    return eager, compiled, backend


def test_every_bucket_is_compiled_up_front(runners):
    _, compiled, backend = runners
    # one graph per bucket and architecture (the target and its perturbed copy share theirs): past
    # dynamo's default limit of 8 graphs per function, where it would silently run the rest eagerly
    assert backend.graphs == len(BUCKETS) * 2 > 8


@pytest.mark.spread("temperature")  # make test: each case greedy or sampling, in turn (tests/tiers.py)
@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("method,which,gamma,args", CASES)
def test_compiled_runner_emits_the_eager_runners_tokens(runners, method, which, gamma, args, temperature):
    eager, compiled, backend = runners
    if temperature == 0 and not parse_method(method).greedy_ok:
        pytest.skip(f"{method} samples only")
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


def test_audit_passes_over_long_outputs(runners):
    eager, compiled, _ = runners
    models = [compiled[0], compiled[1]]
    for method, gamma in [("sd", 3), ("we_se", [1, 3])]:
        result = generate(
            models, PROMPTS[3], method, gamma=gamma, max_new_tokens=120, temperature=1.0, seed=2, audit=Audit(models)
        )
        assert len(result.token_ids) == 120


@pytest.mark.integration
def test_inductor_on_the_cpu_matches_eager():
    """The real compiler (inductor's C++ kernels) in float64: token for token the eager runner's output, a
    token tree's masked forwards included (prompt lookup's continuations as its branches)."""
    model = tiny_llama(5, layers=1, hidden=16)
    fast = set_runner(copy.deepcopy(model), "compiled", backend="inductor")
    for method, models, gamma, args, tree in [
        ("large_model", [0], 1, {}, None),
        ("sd", [0], 3, {"proposer": "lookup"}, None),
        ("sd", [0, 0], 2, {}, None),
        ("sd", [0], 3, {"proposer": "lookup"}, [2]),
    ]:
        for prompt in PROMPTS[:4]:
            kw = dict(gamma=gamma, max_new_tokens=30, method_args=args, temperature=0.0, tree=tree)
            want = generate([model] * len(models), prompt, method, **kw)
            assert generate([fast] * len(models), prompt, method, **kw).token_ids == want.token_ids


def assert_autotuned_emits_eager_tokens(model, fast) -> None:
    """``fast`` (an autotuned copy of ``model``) emits ``model``'s tokens, greedy and sampled, compiling nothing."""
    for temperature in (0.0, 1.0):
        for method, args in [("large_model", {}), ("sd", {"proposer": "lookup"})]:
            for prompt in PROMPTS[:4]:
                kw = dict(gamma=3, max_new_tokens=30, method_args=args, temperature=temperature, seed=3)
                want = generate([model], prompt, method, **kw)
                with torch._dynamo.config.patch(error_on_recompile=True):
                    assert generate([fast], prompt, method, **kw).token_ids == want.token_ids


@pytest.mark.integration
def test_autotuned_cpu_kernels_emit_the_eager_runners_tokens():
    """``compiled+autotune``: inductor's own C++ matrix kernels over frozen float32 weights (counted), the
    eager runner's tokens greedy and sampled, nothing compiled again while decoding."""
    from torch._dynamo.utils import counters

    model = tiny_llama(5, layers=1, hidden=16).float()
    fast = set_runner(copy.deepcopy(model), "compiled+autotune")
    before = counters["inductor"]["cpp_templated_kernel_counter"]
    StaticRunner(fast, 32, max_len=60)  # compiles every bucket, for the cache size the generations use
    assert counters["inductor"]["cpp_templated_kernel_counter"] >= len(BUCKETS) > before
    assert_autotuned_emits_eager_tokens(model, fast)


def test_buckets_and_cache_sizes():
    assert [bucket(k) for k in (1, 2, 3, 5, 16, 17)] == [1, 2, 4, 8, 16, None]
    assert cache_len(10) == 256 and cache_len(257) == 512 and cache_len(512) == 512


def test_an_unknown_runner_is_one_line():
    with pytest.raises(ArgumentError, match="runner='fast': expected one of eager, compiled"):
        set_runner(tiny_llama(0), "fast")


def test_the_cache_refuses_to_overflow(runners):
    _, compiled, _ = runners
    runner = StaticRunner(compiled[0], 32, max_len=60)
    with torch.inference_mode(), pytest.raises(ArgumentError, match="holds 60 positions"):
        runner.extend(list(range(30)), 1)
        runner.crop(10)
        runner.extend([i % 32 for i in range(50)], 1)
        runner.extend([1], 1)


def test_device_and_runner_are_checked_in_one_line():
    with pytest.raises(ModelError, match="device='gpu' for model 'm': expected cpu, cuda, cuda:N or auto"):
        ModelSpec("m", device="gpu").resolved_device()
    if not torch.cuda.is_available():
        with pytest.raises(ModelError, match="device='cuda:1' for model 'm': this machine has no CUDA device"):
            ModelSpec("m", device="cuda:1").resolved_device()
    assert ModelSpec("m", device="auto").resolved_device() == "auto"


def test_a_model_loads_on_the_compiled_runner_and_spread_by_accelerate(tiny_dir, monkeypatch):
    from transformers import AutoModelForCausalLM

    calls = []
    real = AutoModelForCausalLM.from_pretrained
    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", lambda *a, **kw: calls.append(kw) or real(*a, **kw))
    model, _ = load_spec(ModelSpec("tiny", str(tiny_dir), runner="compiled", device="auto"))
    assert runner_of(model) == ("compiled", None)
    assert calls[-1]["device_map"] == "auto"  # accelerate places the layers (all on the CPU here)
    assert not any(isinstance(m, PackedLinear) for m in model.modules())  # inductor packs its own weights
    eager, _ = load_spec(ModelSpec("tiny", str(tiny_dir)))
    assert runner_of(eager) == ("eager", None)
    assert any(isinstance(m, PackedLinear) for m in eager.modules()) == cpu_kernels.available()


def test_rows_are_combined_on_the_decoders_device():
    rows = torch.randn(2, 5, dtype=torch.bfloat16)
    out = as_rows(rows, torch.device("cpu"))
    assert out.dtype == torch.float32 and out.device.type == "cpu"
    assert as_rows(out, torch.device("cpu")) is out  # nothing copied where nothing moves


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_models_on_different_devices_form_one_target():
    target = tiny_llama(0, layers=2, hidden=32)
    draft = perturbed(target, 0.08, seed=1)
    want = generate([target, draft], PROMPTS[3], "we_se", gamma=[1, 3], max_new_tokens=30, temperature=0.0)
    moved = [copy.deepcopy(target).to("cuda"), draft]
    got = generate(moved, PROMPTS[3], "we_se", gamma=[1, 3], max_new_tokens=30, temperature=0.0)
    assert got.token_ids == want.token_ids


# ---- token trees on the compiled runner ---------------------------------------------------------

TREE_CASES = [  # method, model indices, gamma, tree, gamma_schedule, method_args
    ("sd", [0, 1], 3, [3, 2, 1], "fixed", {}),
    ("sd", [0, 1], 3, "d8", "dynamic", {"proposer": "lookup+draft"}),
    ("we_se", [0, 1, 2], [1, 2, 3], [2, 2], "fixed", {}),
    ("cd_sd", [0, 1], 2, "4x4x1", "fixed", {"alpha": 0.3}),  # 36 nodes: the 64-token bucket
]


@pytest.fixture(scope="module")
def tree_runners():
    """As ``runners``, with a backend of their own: the masked graphs a tree compiles are counted apart."""
    target = tiny_llama(0, layers=2, hidden=32)
    eager = [target, perturbed(target, 0.08, seed=1), tiny_llama(2)]
    backend = CountingBackend()
    return eager, [set_runner(copy.deepcopy(m), "compiled", backend=backend) for m in eager], backend


@pytest.mark.spread("temperature")  # make test: each tree greedy or sampling, in turn (tests/tiers.py)
@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("method,which,gamma,tree,schedule,args", TREE_CASES)
def test_compiled_runner_decodes_trees_as_the_eager_one(
    tree_runners, method, which, gamma, tree, schedule, args, temperature
):
    eager, compiled, backend = tree_runners
    if temperature == 0 and not parse_method(method).greedy_ok:
        pytest.skip(f"{method} samples only")
    kw = dict(gamma=gamma, method_args=args, temperature=temperature, seed=7, tree=tree, gamma_schedule=schedule)
    models = [compiled[i] for i in which]
    generate(models, PROMPTS[0], method, max_new_tokens=4, **kw)  # its masked graphs, compiled before decoding
    before, calls = backend.graphs, backend.calls
    for prompt in PROMPTS:
        want = generate([eager[i] for i in which], prompt, method, max_new_tokens=40, **kw)
        with torch._dynamo.config.patch(error_on_recompile=True):
            got = generate(models, prompt, method, max_new_tokens=40, **kw)
        assert got.token_ids == want.token_ids, (method, tree, prompt)
        assert [m.forward_calls for m in got.stats.models] == [m.forward_calls for m in want.stats.models]
        assert got.stats.tree_nodes == want.stats.tree_nodes > 0
    assert backend.graphs == before, "a generation compiled a new graph"
    assert backend.calls > calls + len(PROMPTS), "the compiled graphs did not run"


@pytest.mark.exhaustive  # make test: the trees' compiled cases, which compile their masked buckets ahead
def test_a_tree_compiles_its_masked_buckets_once_and_room_for_its_nodes():
    from pipeline.decoding.static import TREE_BUCKETS, compile_ahead

    assert [bucket(k, TREE_BUCKETS) for k in (1, 3, 17, 33, 64, 65)] == [1, 4, 32, 64, 64, None]
    backend = CountingBackend()
    model = set_runner(tiny_llama(3), "compiled", backend=backend)
    compile_ahead([model], [230], tree_tokens=16)  # the chain's cache (256) and the tree's (512)
    graphs = model.__dict__["_specens_static_graphs"]
    assert sorted(g.length for g in graphs) == [256, 512]
    tree = next(g for g in graphs if g.length == 512)
    assert tree.masked_sizes == {b for b in TREE_BUCKETS if b <= 16}
    assert backend.graphs == 2 * len(BUCKETS) + len(tree.masked_sizes)
    compiled = backend.graphs
    runner = StaticRunner(model, 32, max_len=230)
    assert runner.graphs.length == 256
    runner.prepare_masked(16)  # moves to the tree's cache, compiled ahead: nothing compiled now
    assert runner.graphs is tree and runner.max_len == 246 and backend.graphs == compiled
    assert not next(g for g in graphs if g.length == 256).busy  # the chain's cache is free again


def tiny_of(family: str, seed: int) -> torch.nn.Module:
    """A random model of another family of config/paper.yaml (OPT, Qwen2), float64, shaped like ``tiny_llama``."""
    from transformers import OPTConfig, OPTForCausalLM, Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    if family == "opt":
        config = OPTConfig(
            vocab_size=32, hidden_size=16, ffn_dim=32, num_hidden_layers=2, num_attention_heads=2,
            max_position_embeddings=256, word_embed_proj_dim=16, init_std=0.5,
        )  # fmt: skip
        return OPTForCausalLM(config).to(torch.float64).eval()
    config = Qwen2Config(
        vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, max_position_embeddings=256, initializer_range=0.5, tie_word_embeddings=False,
    )  # fmt: skip
    return Qwen2ForCausalLM(config).to(torch.float64).eval()


@pytest.mark.parametrize("family", ["opt", pytest.param("qwen2", marks=pytest.mark.exhaustive)])  # make test: OPT
def test_the_paper_grids_other_families_on_the_compiled_runner_emit_the_eager_runners_tokens(family):
    """config/paper.yaml runs OPT and Qwen2 models on the compiled runner too: their static caches (learned
    positions for OPT) under the runner's cropping, graphs traced by dynamo (run eagerly here)."""
    eager = [tiny_of(family, 0), tiny_of(family, 1)]
    compiled = [set_runner(copy.deepcopy(m), "compiled", backend="eager") for m in eager]
    for method, which, gamma, args in [
        ("large_model", [0], 1, {}),
        ("sd", [0, 1], 3, {}),
        ("cd_se", [0, 1], [1, 3], {"alpha": 0.1}),
    ]:
        for prompt in PROMPTS[:3]:
            kw = dict(gamma=gamma, max_new_tokens=30, method_args=args, temperature=0.0, seed=1)
            want = generate([eager[i] for i in which], prompt, method, **kw)
            got = generate([compiled[i] for i in which], prompt, method, **kw)
            assert got.token_ids == want.token_ids, (family, method, prompt)
