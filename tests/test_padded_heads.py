"""Members that share one tokenizer but whose heads are padded to different sizes (Qwen2.5-7B's 152,064 rows
beside Qwen2.5-0.5B's 151,936 for 151,665 tokens, the field's classic draft pair): the rows no token maps to are
cropped, and the set is one vocabulary for every method, in the generation job, the lm-eval model and the
log-likelihood job (the preflight's side: tests/test_preflight.py)."""

from __future__ import annotations

import json

import pytest
import torch

from pipeline.cell import Cell
from pipeline.generate_job import run_cell
from pipeline.models import ModelError, ModelSpec, decode_vocabulary, load, token_rows

from .conftest import save_tiny

PADDING = 64


@pytest.fixture(scope="module")
def padded_dir(tmp_path_factory, smol_tokenizer):
    """A tiny model with the bundled tokenizer whose head has 64 rows past it (a 'large' model of the pair)."""
    return save_tiny(tmp_path_factory.mktemp("models") / "padded", smol_tokenizer, seed=3, padding=PADDING)


def test_a_padded_head_is_cropped_to_the_shared_tokenizer(padded_dir, tiny_dir):
    (padded, tok), (plain, _) = load(padded_dir), load(tiny_dir)
    assert padded.get_output_embeddings().weight.shape[0] == len(tok) + PADDING
    assert decode_vocabulary([padded, plain], [tok, tok]) == {"vocab_size": len(tok)}
    assert decode_vocabulary([padded], [tok]) == {"vocab_size": len(tok)}  # alone too: every method, one vocabulary
    assert decode_vocabulary([plain, plain], [tok, tok]) == {}  # nothing padded: nothing to crop
    assert token_rows([plain], tok) is None


def test_a_tokenizer_larger_than_a_head_is_one_line(tiny_dir):
    model, tok = load(tiny_dir)
    tok.add_tokens(["<extra-1>", "<extra-2>"])
    with pytest.raises(
        ModelError, match=f"the tokenizer has {len(tok)} tokens but a model's head scores {len(tok) - 2}"
    ):
        token_rows([model], tok)


def _cell(models, method, baseline, temperature=0.0, **args):
    return Cell(
        models=[ModelSpec(name, str(path)) for name, path in models],
        method=method,
        task="humaneval",
        gamma=2,
        method_args=args,
        size=2,
        max_new_tokens=6,
        baseline=baseline,
        baseline_args={k: v for k, v in args.items() if k != "proposer"},
        temperature=temperature,
    )


@pytest.mark.parametrize(
    ("method", "baseline", "args"),
    [("sd", "large_model", {}), ("cd_sd", "cd", {"alpha": 0.1}), ("we_se", "we", {"lambda": 0.5})],
)
def test_a_set_of_one_tokenizer_and_padded_heads_runs_every_method_over_it(
    padded_dir, tiny_dir, tmp_path, method, baseline, args
):
    out = tmp_path / "gen" / f"{method}.jsonl"
    cell = _cell([("large", padded_dir), ("small", tiny_dir)], method, baseline, **args)
    assert run_cell(cell, out, progress=False)["samples"] == 2
    for row in map(json.loads, out.read_text().splitlines()):
        assert row["output"] == row["baseline"]["output"]  # greedy: lossless against its standard method


def test_sampling_on_a_padded_set_runs_and_keeps_to_the_tokenizer(padded_dir, tiny_dir, tmp_path):
    out = tmp_path / "gen" / "we_sd.jsonl"
    cell = _cell([("large", padded_dir), ("small", tiny_dir)], "we_sd", "we", temperature=1.0, **{"lambda": 0.5})
    assert run_cell(cell, out, progress=False)["samples"] == 2


def test_log_likelihoods_on_a_padded_set_are_over_the_tokenizers_rows(padded_dir, tiny_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from pipeline.likelihood import load_distributions
    from pipeline.lm_eval_model import SpecEnsLM

    context, continuation = "def add(a, b):", " return a + b"
    tok = AutoTokenizer.from_pretrained(tiny_dir)
    ctx, whole = tok.encode(context), tok.encode(context + continuation)
    logits = []
    for d in (padded_dir, tiny_dir):  # by hand: each head cropped to the tokenizer's rows, then mixed
        model = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float64).eval()
        with torch.no_grad():
            logits.append(model(torch.tensor([whole])).logits[0, len(ctx) - 1 : -1, : len(tok)])
    mixed = torch.log(0.7 * torch.softmax(logits[0], -1) + 0.3 * torch.softmax(logits[1], -1))
    expected = float(sum(mixed[i, t] for i, t in enumerate(whole[len(ctx) :])))

    from lm_eval.api.instance import Instance

    requests = [Instance("loglikelihood", {}, (context, continuation), 0)]
    lm = SpecEnsLM(models=f"a={padded_dir}+b={tiny_dir}", method="we_sd", **{"lambda": 0.3})
    assert lm.loglikelihood(requests, disable_tqdm=True)[0][0] == pytest.approx(expected, abs=1e-4)
    entries = {"a": {"name": "a", "source": str(padded_dir)}, "b": {"name": "b", "source": str(tiny_dir)}}
    shared = load_distributions({"we": {"method": "we", "models": ["a", "b"], "args": {"lambda": 0.3}}}, entries)
    assert shared.loglikelihood(requests, disable_tqdm=True)[0]["we"][0] == pytest.approx(expected, abs=1e-4)


def test_transformers_assisted_generation_on_padded_heads_is_one_line(padded_dir, tiny_dir):
    from pipeline.decoding import generate

    (padded, tok), (plain, _) = load(padded_dir), load(tiny_dir)
    with pytest.raises(ValueError, match="needs heads of one size") as err:
        generate([padded, plain], tok("def f():").input_ids, "hf_assisted", vocab_size=len(tok), max_new_tokens=4)
    assert "\n" not in str(err.value)
