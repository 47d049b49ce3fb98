"""On a CUDA device: the real compiled runners (inductor's kernels, CUDA graphs) and the members' own streams
(``E_p``) emit the eager runner's tokens, in float64 so that no rounding can flip a token. Skipped without a
GPU; ``benchmarks/gpu/run.sh`` runs them on one."""

from __future__ import annotations

import copy

import pytest
import torch

from pipeline.decoding import generate
from pipeline.decoding.runner import set_runner
from pipeline.decoding.static import StaticRunner

from .conftest import perturbed, tiny_llama
from .test_static_runner import CASES, PROMPTS, TREE_CASES, assert_autotuned_emits_eager_tokens

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


@pytest.fixture(scope="module")
def cuda_models():
    """Eager models on the GPU and copies of them on the ``compiled`` runner, every bucket compiled up front."""
    target = tiny_llama(0, layers=2, hidden=32)
    eager = [m.to("cuda") for m in (target, perturbed(target, 0.08, seed=1), tiny_llama(2))]
    compiled = [set_runner(copy.deepcopy(m), "compiled") for m in eager]
    for m in compiled:
        StaticRunner(m, 32, max_len=60)
    return eager, compiled


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("method,which,gamma,args", CASES)
def test_compiled_runner_on_cuda_emits_the_eager_runners_tokens(cuda_models, method, which, gamma, args, temperature):
    from pipeline.decoding.spec import parse_method

    eager, compiled = cuda_models
    if temperature == 0 and not parse_method(method).greedy_ok:
        pytest.skip(f"{method} samples only")
    for prompt in PROMPTS:
        kw = dict(gamma=gamma, max_new_tokens=40, method_args=args, temperature=temperature, seed=7)
        want = generate([eager[i] for i in which], prompt, method, **kw)
        with torch._dynamo.config.patch(error_on_recompile=True):
            got = generate([compiled[i] for i in which], prompt, method, **kw)
        assert got.token_ids == want.token_ids, (method, prompt)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("method,which,gamma,tree,schedule,args", TREE_CASES)
def test_trees_on_the_compiled_runner_on_cuda_emit_the_eager_runners_tokens(
    cuda_models, method, which, gamma, tree, schedule, args, temperature
):
    """Token trees over CUDA graphs of masked forwards (and the compaction inside the static cache)."""
    eager, compiled = cuda_models
    kw = dict(gamma=gamma, method_args=args, temperature=temperature, seed=7, tree=tree, gamma_schedule=schedule)
    models = [compiled[i] for i in which]
    generate(models, PROMPTS[0], method, max_new_tokens=4, **kw)  # the masked graphs, compiled before decoding
    for prompt in PROMPTS:
        want = generate([eager[i] for i in which], prompt, method, max_new_tokens=40, **kw)
        with torch._dynamo.config.patch(error_on_recompile=True):
            got = generate(models, prompt, method, max_new_tokens=40, **kw)
        assert got.token_ids == want.token_ids, (method, tree, prompt)


def test_members_on_their_own_streams_emit_the_standard_ensembles_tokens(cuda_models):
    eager, _ = cuda_models
    for temperature in (0.0, 1.0):
        for prompt in PROMPTS:
            kw = dict(max_new_tokens=40, method_args={"lambda": 0.4}, temperature=temperature, seed=5)
            want = generate(eager[:2], prompt, "we", **kw)
            assert generate(eager[:2], prompt, "we_p", **kw).token_ids == want.token_ids


def test_autotuned_runner_on_cuda_emits_the_eager_runners_tokens():
    model = tiny_llama(5, layers=1, hidden=16).to("cuda")
    fast = set_runner(copy.deepcopy(model), "compiled+autotune")
    StaticRunner(fast, 32, max_len=60)
    assert_autotuned_emits_eager_tokens(model, fast)


def test_compiled_members_of_a_parallel_ensemble_emit_the_standard_ensembles_tokens():
    """``we_p`` over CUDA-graphed members (one device's shared graph pool): models large enough for two
    forwards to overlap on the device, where graphs replayed on two streams at once overwrote each other's
    buffers (NaN logits). The CUDA-graph backend alone (no inductor kernels) keeps the compile short."""
    models = [tiny_llama(11, hidden=1024, layers=8, init=0.05), tiny_llama(12, hidden=512, layers=4, init=0.05)]
    models = [set_runner(m.to("cuda"), "compiled", backend="cudagraphs") for m in models]
    for m in models:
        StaticRunner(m, 32, max_len=60)
    for temperature in (0.0, 1.0):
        for prompt in PROMPTS[:3]:
            kw = dict(max_new_tokens=40, method_args={"lambda": 0.5}, temperature=temperature, seed=3)
            want = generate(models, prompt, "we", **kw)
            assert generate(models, prompt, "we_p", **kw).token_ids == want.token_ids, (temperature, prompt)


def test_a_draft_is_distilled_on_cuda_and_its_teacher_data_read_on_a_cpu(tiny_dir, tmp_path, monkeypatch):
    """A GPU machine distils where the teacher runs (the config's default device there): the prompts, labels and
    held-out sequences reach the teacher's device, the kept ids the draft's, and the stored teacher data holds CPU
    tensors that a CPU machine reads."""
    from pipeline.models import ModelSpec, Recipe
    from pipeline.models.resolve import ensure_draft

    monkeypatch.setenv("SPECENS_CACHE", str(tmp_path / "cache"))
    recipe = Recipe(
        layers=1, head_tokens=64, prompts=4, new_tokens=8, source_chunks=2, chunk_tokens=64, eval_prompts=2, steps=5
    )
    out = ensure_draft(ModelSpec("tiny", source=str(tiny_dir), device="cuda"), recipe, out_dir=tmp_path / "draft")
    assert (out / "model.safetensors").exists()
    (store,) = (tmp_path / "cache" / "teacher-data").iterdir()
    saved = torch.load(store, weights_only=True)
    tensors = [t for part in ("examples", "held") for row in saved[part] for t in row if isinstance(t, torch.Tensor)]
    assert tensors and {t.device.type for t in tensors} == {"cpu"}
