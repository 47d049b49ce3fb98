"""Tiny float64 Llama models for exact and statistical tests (no downloads)."""

from __future__ import annotations

import copy
from collections import Counter

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from .tiers import mark_exhaustive

# tiny models: threads cost more than they give
torch.set_num_threads(1)

# The files that take minutes, started first, so that the two workers of `make test` (pytest-xdist, one file at a
# time: --dist loadfile --no-loadscope-reorder) end together instead of one waiting on a long file begun last;
# the other files follow by their number of tests, the order xdist would give them (tests/README.md).
LONGEST_FIRST = ("test_sampling_new_methods.py", "test_sampling_lossless.py", "test_workflow.py", "test_slurm.py")


# The integration tier (marker ``integration``): tests that bring up a whole system end to end, minutes each on this
# machine: vLLM's environment and its cells, a one-node SLURM cluster, the whole DAG on tiny models (the fixtures
# below, every test that uses one), and the few marked in their files (the bundled model's benchmark, inductor's
# CPU kernels, SLURM's profile over the grids, HumanEval's canonical solutions, lm-eval's documented
# command). `make test` leaves them out; `make test-all`, what CI runs, takes them too (README, "Tests").
INTEGRATION_FIXTURES = frozenset({"vllm_ready", "vllm_run", "slurm_cluster", "tiny_run"})

# The exhaustive tier (marker ``exhaustive``): the cases of a conformance test beyond its representative set. A test
# marked ``@pytest.mark.spread("setting", ...)`` keeps in `make test` each combination of its other parameters once,
# at the spread parameters' values run least so far, and every spread value (``tiers.quick``); the rest are marked
# ``exhaustive``, which `make test` leaves out and `make test-all` (CI) runs. tests/test_tiers.py checks that the
# quick tier keeps a greedy and a chi-square case of every registered ensemble's speculative forms and proposer kind.


@pytest.hookimpl(tryfirst=True)  # marked before ``-m`` selects by marker
def pytest_collection_modifyitems(config, items):
    for item in items:
        if INTEGRATION_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.integration)
    mark_exhaustive(items, pytest.mark.exhaustive)
    if missing := [name for name in LONGEST_FIRST if name not in {p.name for p in config.rootpath.glob("tests/*.py")}]:
        raise pytest.UsageError(f"tests/conftest.py LONGEST_FIRST names files that do not exist: {missing}")
    counts = Counter(item.path.name for item in items)
    rank = {name: LONGEST_FIRST.index(name) if name in LONGEST_FIRST else len(LONGEST_FIRST) for name in counts}
    items.sort(key=lambda item: (rank[item.path.name], -counts[item.path.name], item.path.name))


def tiny_llama(seed: int, vocab: int = 32, hidden: int = 16, layers: int = 1, init: float = 0.5) -> LlamaForCausalLM:
    """A random Llama-shaped causal LM in float64, peaked enough to have structure."""
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=256,
        initializer_range=init,
        tie_word_embeddings=False,
    )
    return LlamaForCausalLM(config).to(torch.float64).eval()


def perturbed(model: LlamaForCausalLM, noise: float, seed: int) -> LlamaForCausalLM:
    """A copy of ``model`` with Gaussian noise on every weight: a draft that partly agrees."""
    out = copy.deepcopy(model)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in out.parameters():
            p.add_(torch.randn(p.shape, generator=gen, dtype=p.dtype) * noise)
    return out


def without_null(cells) -> list[str]:
    """A config's cell ids, sorted, less its null cell (``timing.null``; tests/test_speed.py tests it)."""
    return sorted(c for c in cells if not c.endswith("-null"))


@pytest.fixture(scope="session")
def trio():
    """A target, a close draft and a third, different model (vocabulary 32)."""
    target = tiny_llama(0, layers=2, hidden=32)
    return target, perturbed(target, 0.08, seed=1), tiny_llama(2)


@pytest.fixture(scope="session")
def smol_tokenizer():
    from transformers import AutoTokenizer

    from pipeline.models import bundled_dir

    return AutoTokenizer.from_pretrained(bundled_dir())


def save_tiny(
    path, tokenizer, seed: int = 0, layers: int = 2, padding: int = 0, hidden: int = 16, init: float | None = None
):
    """A tiny random float32 model with ``tokenizer``, saved as a local model directory (``padding``: head rows
    past the tokenizer's, as models padded for their kernels have; here a thousand times longer than the others,
    so that a decode that does not crop them picks one at nearly every step; ``init``: the weights' spread,
    transformers' ``initializer_range``: a wide one peaks the rows)."""
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer) + padding,
        hidden_size=hidden,  # 2 heads: a head of hidden / 2 (vLLM's CPU attention takes 32 and more)
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        eos_token_id=tokenizer.eos_token_id,
        **({"initializer_range": init} if init is not None else {}),
    )
    model = LlamaForCausalLM(config)
    if padding:
        with torch.no_grad():
            model.get_output_embeddings().weight[len(tokenizer) :] *= 1000
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory, smol_tokenizer):
    """A tiny random float32 model with the bundled model's tokenizer, saved as a local directory."""
    return save_tiny(tmp_path_factory.mktemp("models") / "tiny", smol_tokenizer)


@pytest.fixture(scope="session")
def tiny_dir2(tmp_path_factory, smol_tokenizer):
    """Another tiny model (other weights, one layer) with the same tokenizer."""
    return save_tiny(tmp_path_factory.mktemp("models") / "tiny2", smol_tokenizer, seed=1, layers=1)


def cell_entry(cell_id: str, models: tuple[str, ...] = ("a", "b")):
    """The cell file of an ``sd`` cell, as the workflow writes it (``pipeline.experiment.cell.CellFile``)."""
    from pipeline.experiment.cell import CellFile

    dims = {"id": cell_id, "experiment": "exp", "grid": "g", "model_set": "pair", "models": list(models)}
    dims |= {"large_model": models[0], "method": "sd", "family": "single", "kind": "sd", "dataset": "humaneval"}
    cell = {"models": list(models), "method": "sd", "task": "humaneval", "gamma": 2}
    return CellFile.from_json({"cell": cell, "dims": {**dims, "temperature": 0.0}})
