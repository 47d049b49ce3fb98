"""The runner benchmark runs end to end on a tiny shape: costs, tokens/s, the bound, oracle-draft pairs."""

from __future__ import annotations

import json

import pytest

from pipeline.bench import runners as runner_bench


def test_runner_bench_reports_costs_and_oracle_pairs(tmp_path, capsys):
    out = tmp_path / "runners.json"
    argv = ["--shapes", "tiny", "--runners", "eager", "--ks", "1", "2", "4", "--repeats", "2", "--new-tokens", "24"]
    assert runner_bench.main([*argv, "--pairs", "tiny:tiny", "--accept", "0.3", "0.9", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    (row,) = report["runners"]
    assert row["tokens_per_s"] > 0 and row["bound_tokens_per_s"] > row["tokens_per_s"]
    assert set(row["ms_per_forward"]) == {"1", "2", "4"}
    low, high = report["pairs"]
    # acceptance is set by construction (per position, so only about a over a short output)
    assert low["acceptance"] == pytest.approx(0.3, abs=0.2) and high["acceptance"] == pytest.approx(0.9, abs=0.1)
    assert low["predicted"] < high["predicted"]
    assert "copy bandwidth" in capsys.readouterr().out


def test_runners_are_measured_interleaved_with_an_interval(tmp_path):
    out = tmp_path / "runners.json"
    argv = ["--shapes", "tiny", "--runners", "eager", "eager+pack", "--ks", "1", "2", "--repeats", "4"]
    assert runner_bench.main([*argv, "--new-tokens", "8", "--json", str(out)]) == 0
    first, second = json.loads(out.read_text())["runners"]
    assert (first["runner"], second["runner"]) == ("eager", "eager+pack") and "speedup" not in first
    for key in ("speedup", "forward_speedup"):
        ratio, low, high = second[key]
        assert 0 < low <= ratio <= high


def test_the_oracle_draft_proposes_the_reference_at_the_rate_asked():
    import random

    import torch

    from tests.conftest import tiny_llama

    model = tiny_llama(0)
    reference = [random.Random(i).randrange(32) for i in range(400)]
    draft = runner_bench.OracleDraft(model, reference, a=0.7)
    with torch.inference_mode():
        logits = draft(torch.tensor([reference[:300]]), position_ids=torch.arange(300)[None]).logits[0]
    hits = (logits.argmax(-1)[:-1] == torch.tensor(reference[1:300])).float().mean().item()
    assert hits == pytest.approx(0.7, abs=0.08)


def test_oracle_pairs_in_sixteen_bits_are_refused_in_one_line(capsys):
    with pytest.raises(SystemExit) as exit:
        runner_bench.main(
            ["--shapes", "llama-68m", "--dtype", "bfloat16", "--pairs", "llama-68m:llama-68m", "--device", "cpu"]
        )
    assert exit.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "--pairs with --dtype bfloat16: oracle pairs need float32 or float64" in err
