"""Members that share one tokenizer but whose heads are padded to different sizes (Qwen2.5-7B's 152,064 rows
beside Qwen2.5-0.5B's 151,936 for 151,665 tokens, the field's classic draft pair): the rows no token maps to are
cropped, and the set is one vocabulary for every method, in the generation job, the lm-eval model and the
log-likelihood job (the preflight's side: tests/test_preflight.py)."""

from __future__ import annotations

import json

import pytest
import torch

from pipeline.experiment.cell import Cell
from pipeline.job.generate import run_cell
from pipeline.models import ModelError, ModelSpec, decode_vocabulary, load, token_rows

from .conftest import save_tiny

PADDING = 64


@pytest.fixture(scope="module")
def padded_dir(tmp_path_factory, smol_tokenizer):
    """A tiny model with the bundled tokenizer whose head has 64 rows past it (a 'large' model of the pair)."""
    return save_tiny(tmp_path_factory.mktemp("models") / "padded", smol_tokenizer, seed=3, padding=PADDING)


def test_the_padding_rows_win_where_nothing_crops_them(padded_dir, smol_tokenizer):
    """The fixture's premise: uncropped, the padded model emits padding ids (so the tests below can fail)."""
    from pipeline.decoding import generate

    model, tok = load(padded_dir)
    out = generate([model], tok("def f():").input_ids, max_new_tokens=4).token_ids
    assert all(t >= len(tok) for t in out)


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
    with pytest.raises(ModelError, match=f"ids reach {len(tok) - 1} but a model's head scores {len(tok) - 2} rows"):
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
        assert row["token_ids"] and max(row["token_ids"] + row["baseline"]["token_ids"]) < TOKENS  # no padding id


TOKENS = 49152  # the bundled tokenizer's ids: 0 .. 49151


@pytest.mark.parametrize(
    ("models", "method", "baseline", "args"),
    [
        (["padded"], "large_model", None, {}),  # a padded model alone: every method samples the same tokens
        (["padded", "plain"], "we_sd", "we", {"lambda": 0.5}),
        (["padded", "plain"], "sd", "large_model", {}),
    ],
)
def test_sampling_on_a_padded_set_keeps_to_the_tokenizers_rows(
    padded_dir, tiny_dir, tmp_path, models, method, baseline, args
):
    paths = {"padded": padded_dir, "plain": tiny_dir}
    out = tmp_path / "gen" / f"{method}.jsonl"
    cell = _cell([(m, paths[m]) for m in models], method, baseline, temperature=1.0, **args)
    assert run_cell(cell, out, progress=False)["samples"] == 2
    for row in map(json.loads, out.read_text().splitlines()):
        ids = row["token_ids"] + (row["baseline"]["token_ids"] if baseline else [])
        assert ids and max(ids) < TOKENS


def test_a_feature_head_on_a_padded_model_proposes_over_the_same_rows(padded_dir, smol_tokenizer):
    """An EAGLE head scores every row of its model's head; its rows are cropped as the target's, so that
    verification compares rows of one vocabulary (sampled and greedy, chains and trees)."""
    from pipeline.decoding import generate
    from pipeline.decoding.proposers.feature import attach
    from pipeline.models.feature_head import FeatureHead

    model, tok = load(padded_dir, pack=False)
    torch.manual_seed(0)
    attach(model, FeatureHead(model, None))
    prompt = tok("def add(a, b):").input_ids
    crop = {"vocab_size": TOKENS, "method_args": {"proposer": "eagle"}, "max_new_tokens": 8}
    plain = generate([model], prompt, "large_model", vocab_size=TOKENS, max_new_tokens=8)
    assert generate([model], prompt, "sd", gamma=2, **crop).token_ids == plain.token_ids
    assert generate([model], prompt, "sd", tree="2x1", **crop).token_ids == plain.token_ids
    sampled = generate([model], prompt, "sd", gamma=2, temperature=1.0, **crop).token_ids
    assert sampled and max(sampled) < TOKENS


def test_log_likelihoods_on_a_padded_set_are_over_the_tokenizers_rows(padded_dir, tiny_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from pipeline.job.likelihood import load_distributions
    from pipeline.job.lm_eval_model import SpecEnsLM

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
