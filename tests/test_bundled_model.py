"""The real bundled model: losslessness on SmolLM2-135M-Instruct and a benchmark smoke run."""

from __future__ import annotations

import json

import pytest
import torch

from pipeline.bench import methods as bench
from pipeline.decoding import generate
from pipeline.models import ModelError, load, load_bundled, truncated_copy


@pytest.fixture(scope="module")
def smol():
    model, tokenizer = load_bundled(pack=False)  # plain layers: the test converts them to float64
    return model, tokenizer


def test_speculative_methods_match_baselines_on_the_real_model(smol):
    model, tokenizer = smol
    target = model.to(torch.float64)  # float64: k-row and one-row forwards agree to the last bit
    try:
        draft = truncated_copy(target, 2)
        prompts = bench.humaneval_prompts(2)
        for text in prompts:
            ids = tokenizer(text).input_ids
            kw = dict(max_new_tokens=12, eos_token_id=tokenizer.eos_token_id)
            base = generate([target, draft], ids, "large_model", **kw).token_ids
            assert generate([target, draft], ids, "sd", gamma=3, **kw).token_ids == base
            we = generate([target, draft], ids, "we", method_args={"lambda": 0.5}, **kw).token_ids
            se = generate([target, draft], ids, "we_se", gamma=[1, 3], method_args={"lambda": 0.5}, **kw)
            assert se.token_ids == we
    finally:
        model.to(torch.float32)


def test_truncated_copy_keeps_the_original(smol):
    model, _ = smol
    n = len(model.model.layers)
    draft = truncated_copy(model, 1)
    assert len(draft.model.layers) == 1 and len(model.model.layers) == n
    with pytest.raises(ModelError, match="n_layers=0"):
        truncated_copy(model, 0)


def test_missing_model_directory_is_one_clear_error(tmp_path):
    with pytest.raises(ModelError, match="not found"):
        load(tmp_path / "nope")


@pytest.mark.integration
def test_benchmark_runs_prints_every_method_and_records_the_run(capsys, tmp_path):
    args = ["--prompts", "2", "--max-new-tokens", "4", "--gamma", "1", "--draft", "truncated", "--proposer", "draft"]
    args += ["--parallel"]
    assert bench.main([*args, "--record", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    labels = ("large_model", "sd g=1", "hf_assisted g=1", "we_se g=[1,1]", "we_me", "cd_se g=[1,1]", "ours")
    for label in (*labels, "sd dyn g=1", "we_se dyn g=[1,1]", "we_p", "cd_p"):
        assert label in out
    (record,) = tmp_path.glob("*.json")
    data = json.loads(record.read_text())
    assert data["commit"] and data["machine"]["host"] and data["settings"]["prompts"] == 2
    assert record.name.startswith(data["time"]) and data["commit"] in record.name
    rows = {r["method"]: r for r in data["rows"]}
    assert rows["large_model"]["speedup"] == 1.0 and rows["sd g=1"]["tau"] >= 1.0
    assert len(rows["sd g=1"]["speedup_ci"]) == 2
    assert rows["we_me"]["predicted"] > 0 and rows["we"]["predicted"] is None  # a baseline predicts nothing


def test_heldout_prompts_are_never_the_ones_the_default_run_measures(smol):
    """Settings are chosen on ``--heldout`` prompts: none of them is among the prompts a cell of the default
    config takes (its HumanEval size 10, its Spec-Bench size 12, seed 0), and they come rendered as the run
    renders them (the chat template)."""
    from tasks import get_task, render

    _, tokenizer = smol
    for dataset, size in (("humaneval", 10), ("spec_bench", 12)):
        task = get_task(dataset)
        measured = {render(task, ex, tokenizer, chat=True)[0] for ex in task.load(size, seed=0, hub=False)}
        held = bench.heldout_prompts(dataset, 20, tokenizer, chat=True)
        assert len(set(held)) == 20 and not measured & set(held)
        assert all(p.startswith("<|im_start|>") for p in held)
    with pytest.raises(bench.ArgumentError, match="--prompts 1000: humaneval has 140 prompts beyond"):
        bench.heldout_prompts("humaneval", 1000, tokenizer)


def test_the_round_profile_splits_the_time_outside_the_forwards(smol):
    """The bench's profile: the shares outside the forwards add up to wall minus forwards, each part measured by
    the decoder (proposing, the acceptance rule, cache trimming); transformers' runs show their total only."""
    from pipeline.bench.table import Totals, render_profile, round_profile
    from pipeline.decoding.corpus import Corpus

    model, tokenizer = smol
    ids = tokenizer(bench.humaneval_prompts(1)[0]).input_ids
    ours, theirs = Totals(), Totals()
    kw = dict(max_new_tokens=16, eos_token_id=tokenizer.eos_token_id, temperature=1.0, seed=1)
    ours.add(
        generate(
            [model, model],
            ids,
            "sd",
            gamma=3,
            method_args={"proposer": "suffix+recycle"},
            corpus=Corpus().view("p"),
            **kw,
        )
    )
    theirs.add(generate([model, model], ids, "hf_prompt_lookup", gamma=3, **kw))
    shares = round_profile(ours)
    assert shares["outside"] == pytest.approx(1 - ours.forward / ours.wall)
    parts = ("proposing", "accepting", "trimming", "rest")
    assert sum(shares[k] for k in parts) == pytest.approx(shares["outside"])
    assert shares["proposing"] > 0 and shares["accepting"] > 0 and shares["rest"] >= 0
    assert set(round_profile(theirs)) == {"outside"}
    table = render_profile(
        [{"method": "sd", "outside_forward": shares}, {"method": "hf", "outside_forward": round_profile(theirs)}]
    )
    assert table.splitlines()[-1].startswith("| hf | ") and table.splitlines()[-1].endswith("| - | - | - | - |")


def test_the_positions_study_prints_how_often_each_proposer_holds_the_token(capsys, smol):
    """``python -m pipeline.bench.positions``: every row a share of the replayed positions, the union rows at least
    their parts (a chain's proposal among them), on held-out prompts."""
    from pipeline.bench import positions

    assert positions.main(["--prompts", "2", "--max-new-tokens", "12", "--corpus", "outputs"]) == 0
    out = capsys.readouterr().out
    assert "2 humaneval prompts no default cell measures, " in out
    shares = {
        line.split(" | ")[0][2:]: float(line.split(" | ")[1].rstrip("% |"))
        for line in out.splitlines()
        if line.startswith("| ") and line.endswith("% |")
    }
    assert set(shares) == {label for label, _ in positions.ROWS}
    assert shares["suffix, any of 3"] >= shares["suffix, first candidate"]
    assert shares["suffix's first and recycle's 4"] >= shares["suffix+recycle (the chain's proposal)"]
    assert all(0 <= v <= 100 for v in shares.values()) and shares["recycle, any of 4"] > 0
    assert positions.main(["--prompts", "1000"]) == 2
    assert "--prompts 1000: humaneval has 140 prompts beyond" in capsys.readouterr().err
