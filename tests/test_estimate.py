"""The cost forecast: the bandwidth bound per forward, the cost model's chain (measure/cost.py) for speculative methods,
job counts per rule, the paper's grid on an A100 and the default run against its measured time."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.errors import UserError
from pipeline.experiment import estimate
from pipeline.experiment.config import check_config
from pipeline.experiment.config_file import load_config_file
from pipeline.experiment.grid import expand_cells
from pipeline.experiment.preflight import inspect_config, models_to_prepare
from tests.test_preflight import LLAMA, PUBLIC_CONFIGS, PUBLIC_PARAMETERS, model_dir

ROOT = Path(__file__).resolve().parent.parent
ROPE3 = {
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
    "rope_type": "llama3",
}
LLAMA3 = LLAMA | {"vocab_size": 128256, "max_position_embeddings": 131072, "rope_theta": 500000.0}
LLAMA3 |= {"num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 14336, "hidden_size": 4096}
PAPER_SHAPES = {  # config/paper.yaml's models: public config.json shapes
    "llama-2-7b": PUBLIC_CONFIGS["meta-llama/Llama-2-7b-hf"],
    "vicuna-7b-v1.5": PUBLIC_CONFIGS["meta-llama/Llama-2-7b-hf"],
    "qwen2.5-3b-instruct": PUBLIC_CONFIGS["Qwen/Qwen2.5-3B"],
    "qwen2.5-coder-3b-instruct": PUBLIC_CONFIGS["Qwen/Qwen2.5-3B"],
    "qwen2.5-1.5b-instruct": PUBLIC_CONFIGS["Qwen/Qwen2.5-1.5B"],
    "qwen2.5-coder-1.5b-instruct": PUBLIC_CONFIGS["Qwen/Qwen2.5-1.5B"],
    "qwen2.5-math-1.5b-instruct": PUBLIC_CONFIGS["Qwen/Qwen2.5-1.5B"] | {"max_position_embeddings": 4096},
    "llama-3.1-8b-instruct": LLAMA3
    | {"num_hidden_layers": 32, "tie_word_embeddings": False, "rope_scaling": ROPE3 | {"factor": 8.0}},
    "llama-3.2-1b": LLAMA3
    | {"hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16, "head_dim": 64}
    | {"tie_word_embeddings": True, "rope_scaling": ROPE3 | {"factor": 32.0}},
    "llama-68m": PUBLIC_CONFIGS["JackFram/llama-68m"],
    "opt-13b": PUBLIC_CONFIGS["facebook/opt-125m"]
    | {"hidden_size": 5120, "ffn_dim": 20480, "num_hidden_layers": 40, "num_attention_heads": 40}
    | {"word_embed_proj_dim": 5120},
    "opt-125m": PUBLIC_CONFIGS["facebook/opt-125m"],
}


@pytest.fixture
def llama_pair(tmp_path, monkeypatch):
    model_dir(tmp_path, "llama-2-7b", "meta-llama/Llama-2-7b-hf", ["a"])
    model_dir(tmp_path, "llama-68m", "JackFram/llama-68m", ["a"])
    monkeypatch.setenv("MODEL_PATH", str(tmp_path))


def forecast_of(
    methods: list[str],
    size: int,
    acceptance: float,
    efficiency: float = 1.0,
    beside=False,
    null=False,
    runners: dict[str, str] | None = None,
    compiled: tuple[float, float, float] | None = None,
) -> dict:
    runners = runners or {}
    config = check_config(
        {
            "models": {m: {"runner": runners[m]} if m in runners else {} for m in ("llama-2-7b", "llama-68m")},
            "grids": [{"name": "g", "model_sets": {"p": ["llama-2-7b", "llama-68m"]}, "methods": methods}],
            "datasets": {"humaneval": {"size": size}},
            "max_new_tokens": 100,
            "gamma": [3],
            "side_by_side": beside,
            "proposer": "draft",
            "timing": {"null": null},
        }
    )
    cells = expand_cells(config)
    infos = inspect_config(config, models_to_prepare(config, cells))
    return estimate.forecast(
        config, cells, infos, estimate.GPUS["a100-80gb"], efficiency, 0.0, acceptance, compiled=compiled
    )


def test_a_model_on_the_compiled_runner_costs_the_compiled_figures_and_its_compiling(llama_pair):
    figures, large = (0.57, 0.75, 300.0), "humaneval/llama-2-7b/large_model-T0"
    eager = forecast_of(["large_model"], 10, 0.7, 0.2, compiled=figures)["cell_hours"][large]
    graphs = forecast_of(["large_model"], 10, 0.7, 0.2, runners={"llama-2-7b": "compiled"}, compiled=figures)
    prefill = 10 * estimate.PROMPT_TOKENS * 2 * PUBLIC_PARAMETERS["meta-llama/Llama-2-7b-hf"] / 312e12 / 3600
    decoding = graphs["cell_hours"][large] - prefill - 300.0 / 3600
    assert decoding / (eager - prefill) == pytest.approx(0.2 / 0.57)  # tokens at 57% of the bound, not 20%
    unpriced = forecast_of(["large_model"], 10, 0.7, 0.2, runners={"llama-2-7b": "compiled"})  # figures not given
    assert unpriced["cell_hours"][large] == pytest.approx(eager)


def test_a_plain_cell_costs_its_tokens_at_the_bandwidth_bound_plus_its_prefill(llama_pair):
    hours = forecast_of(["large_model"], 10, 0.7, null=True)["cell_hours"]
    params = PUBLIC_PARAMETERS["meta-llama/Llama-2-7b-hf"]
    per_token = (params - 32000 * 4096) * 2 / 2039e9  # bfloat16; the input embedding is read one row at a time
    prefill = estimate.PROMPT_TOKENS * 2 * params / 312e12
    one = 10 * (100 * per_token + prefill) / 3600  # the null cell runs it twice, side by side
    assert hours == pytest.approx(
        {"humaneval/llama-2-7b/large_model-T0": one, "humaneval/llama-2-7b/large_model-T0-null": 2 * one}
    )
    assert forecast_of(["large_model"], 10, 0.7, 0.5)["generate_hours"] == pytest.approx(
        10 * (100 * 2 * per_token + prefill) / 3600
    )


@pytest.mark.parametrize("a", [0.0, 0.6, 0.9])
def test_speculative_cells_follow_the_cost_model_at_the_assumed_acceptance(llama_pair, a):
    hours = forecast_of(["large_model", "sd"], 10, a)["cell_hours"]
    t_target = (PUBLIC_PARAMETERS["meta-llama/Llama-2-7b-hf"] - 32000 * 4096) * 2 / 2039e9
    t_draft = (PUBLIC_PARAMETERS["JackFram/llama-68m"] - 32000 * 768) * 2 / 2039e9
    tokens_per_round = (1 - a**4) / (1 - a)  # gamma 3 (Leviathan et al. 2023)
    expected_ratio = (3 * t_draft + t_target) / tokens_per_round / t_target  # decoding only
    large, sd = hours["humaneval/llama-2-7b/large_model-T0"], hours["humaneval/p/sd-T0-g3"]
    prefill = 10 * estimate.PROMPT_TOKENS * 2 * (PUBLIC_PARAMETERS["meta-llama/Llama-2-7b-hf"]) / 312e12 / 3600
    sd_prefill = prefill * (1 + PUBLIC_PARAMETERS["JackFram/llama-68m"] / PUBLIC_PARAMETERS["meta-llama/Llama-2-7b-hf"])
    assert (sd - sd_prefill) / (large - prefill) == pytest.approx(expected_ratio)


def test_a_cell_run_beside_its_baseline_costs_both(llama_pair):
    alone, beside = forecast_of(["large_model", "sd"], 10, 0.7), forecast_of(["sd"], 10, 0.7, beside=True)
    sd, large = "humaneval/p/sd-T0-g3", "humaneval/llama-2-7b/large_model-T0"
    assert beside["cell_hours"][sd] == pytest.approx(alone["cell_hours"][sd] + alone["cell_hours"][large])


def test_the_paper_grid_on_an_a100(tmp_path, monkeypatch, capsys):
    from pipeline.cli import main

    for name, shape in PAPER_SHAPES.items():  # config.json only: the forecast needs the shapes alone
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(json.dumps(shape))
    monkeypatch.setenv("MODEL_PATH", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert main(["estimate", str(ROOT / "config" / "paper.yaml"), "--gpu", "a100-80gb", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["jobs"]["generate"] == len(result["cell_hours"]) == 345 and result["jobs"]["prepare_model"] == 12
    assert result["jobs"]["derive"] == 40  # the ensembles' cells: their runs beside the *_sd cells' samples
    assert result["submissions"] == 12 + 345 + 1  # as the slurm profile's dry run submits them (test_workflow)
    assert result["acceptance"] == estimate.ACCEPTANCE and result["bandwidth_gb_s"] == 2039
    assert result["generate_hours"] == pytest.approx(sum(result["cell_hours"].values()))
    sevens = [h for c, h in result["cell_hours"].items() if c.startswith("humaneval/llama-2-7b/large_model-T")]
    ones = [h for c, h in result["cell_hours"].items() if c.startswith("humaneval/llama-3.2-1b/")]
    assert len(sevens) == 3 and not ones and sevens[0] > 0  # a 1B model is never the first of a set; the null cell
    assert main(["estimate", str(ROOT / "config" / "paper.yaml"), "--gpu", "a100-80gb"]) == 0
    out = capsys.readouterr().out
    total = out.strip().splitlines()[-1]
    assert re.fullmatch(r"total: \d+ jobs, [\d.]+ GPU-hours of generation on a100-80gb", total), total
    assert "acceptance 0.7 (assumed)" in out.splitlines()[0]
    # the grid's models are on the compiled runner: its figures and its compiling per job, which --compile-s sets
    assert result["compiled"] == {"efficiency": 0.57, "floor_ms": 0.75, "compile_s": estimate.COMPILE_S}
    assert "on the compiled one at 57%, at least 0.75 ms, and 300 s of compiling per generation job" in out
    assert (
        main(["estimate", str(ROOT / "config" / "paper.yaml"), "--gpu", "a100-80gb", "--compile-s", "0", "--json"]) == 0
    )
    uncompiled = json.loads(capsys.readouterr().out)
    compiling = 345 * estimate.COMPILE_S / 3600
    assert result["generate_hours"] - uncompiled["generate_hours"] == pytest.approx(compiling)


def test_the_default_run_against_its_measured_time_in_the_docs():
    """The run docs/speed.md times (the whole default grid), on 'cpu' as measured here, two jobs at a time: its
    forecast generation wall time against the run's time less install and model preparation."""
    readme = (ROOT / "docs" / "speed.md").read_text()
    took = re.search(
        r"took (\d+) min (\d+) s on this\s+project's 2-core CPU machine \(the install (\d+) min (\d+) s,.*?"
        r"made on first use,\s+(\d+) min (\d+) s of it",
        readme,
        re.S,
    )
    total, install, prepare = (int(took[i]) * 60 + int(took[i + 1]) for i in (1, 3, 5))
    config = check_config(load_config_file(ROOT / "config" / "default.yaml"))
    cells = expand_cells(config)
    assert len(cells) == 32
    infos = inspect_config(config, models_to_prepare(config, cells), "float32")
    result = estimate.forecast(config, cells, infos, estimate.GPUS["cpu"], 0.59, 0.0, estimate.ACCEPTANCE)
    forecast_wall = result["generate_hours"] * 3600 / 2
    measured = total - install - prepare  # generation, and the speed, score and aggregate jobs beside it
    assert 0.5 < forecast_wall / measured < 1.0, (forecast_wall, measured)


def test_gpu_names_and_bandwidth():
    assert estimate.match_gpu("A100") == "a100-40gb" and estimate.match_gpu("H100_80GB") == "h100-80gb"
    assert estimate.match_gpu("rtx 4090") == "rtx4090" and estimate.match_gpu("mi300x") is None
    with pytest.raises(UserError, match=r"^GPU 'mi300x' is not in the table; accepted: a100-40gb, .*--bandwidth"):
        estimate.gpu_spec("mi300x")


def test_a_gpu_not_in_the_table_by_its_bandwidth(llama_pair, tmp_path, capsys):
    from pipeline.cli import main

    config = tmp_path / "c.yaml"
    grid = {"name": "g", "model_sets": {"p": ["llama-2-7b", "llama-68m"]}, "methods": ["large_model"]}
    config.write_text(
        json.dumps({"models": {"llama-2-7b": {}, "llama-68m": {}}, "grids": [grid], "datasets": {"humaneval": {}}})
    )
    args = ["estimate", str(config), "--efficiency", "1", "--floor-ms", "0", "--json"]
    assert main([*args, "--gpu", "mi300x", "--bandwidth", "5300"]) == 0
    mi300x = json.loads(capsys.readouterr().out)
    assert main([*args, "--gpu", "a100-80gb", "--bandwidth", "5300"]) == 0
    a100 = json.loads(capsys.readouterr().out)  # the same bandwidth: the same decoding, plus its prefill
    assert mi300x["tflops"] == 0 and a100["tflops"] == 312 and a100["gpu"] == "a100-80gb at 5300 GB/s"
    assert 1 < a100["generate_hours"] / mi300x["generate_hours"] < 1.1
    assert a100["compiled"] is None  # no model on the compiled runner: its figures are not shown
    assert main(["estimate", str(config), "--gpu", "a100-80gb"]) == 0
    assert "compiled" not in capsys.readouterr().out


FLAGS = {  # estimate's numeric flags and the range each accepts
    "--bandwidth": (1, 100_000, False, False),  # GB/s: 1e-300 would print a 300-digit forecast
    "--floor-ms": (0, math.inf, False, True),
    "--efficiency": (0.001, 1, False, False),  # below a thousandth of the bandwidth bound: a forecast of nothing
    "--compile-s": (0, math.inf, False, True),
    "--acceptance": (0, 1, False, True),
}


def flag_type(flag: str):
    """The function that parses ``flag`` of ``pipeline estimate`` (what argparse calls on its text)."""
    from pipeline.cli import PARSER
    from pipeline.cli.commands import subparser

    parser = subparser(PARSER, "estimate")
    return next(a.type for a in parser._actions if flag in a.option_strings)


@settings(max_examples=200, deadline=None)
@given(flag=st.sampled_from(sorted(FLAGS)), value=st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=8))
def test_every_numeric_flag_of_estimate_is_a_finite_number_in_its_range_or_one_line(flag, value):
    import argparse

    low, high, low_open, high_open = FLAGS[flag]
    text = str(value)
    try:
        parsed = flag_type(flag)(text)
    except argparse.ArgumentTypeError as err:
        assert "expected a finite number in" in str(err) and "\n" not in str(err)
        return
    assert math.isfinite(parsed)
    assert (parsed > low if low_open else parsed >= low) and (parsed < high if high_open else parsed <= high)


@pytest.mark.parametrize(
    "flag,value",
    [
        ("--bandwidth", "nan"),
        ("--bandwidth", "1e-300"),
        ("--floor-ms", "-1"),
        ("--gpu", ""),
        ("--efficiency", "inf"),
        ("--efficiency", "1e-300"),
    ],
)
def test_a_bad_flag_of_estimate_is_one_line_before_any_work(flag, value, capsys):
    from pipeline.cli import main

    with pytest.raises(SystemExit) as code:
        main(["estimate", "config/default.yaml", flag, value])
    assert code.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith(f"pipeline estimate: error: argument {flag}: {value!r}: expected")


def test_a_gamma_past_the_tokens_generated_costs_what_the_tokens_do():
    """The decoder never drafts past the tokens left, so a gamma of 10**9 is forecast as max_new_tokens would be,
    not as a billion drafted tokens a round."""
    from pipeline.experiment.estimate import token_seconds

    t, args = [0.02, 0.002], ("sd", "lookup+draft", 0.6)
    huge = token_seconds(args[0], t, 10**9, args[1], args[2], max_new_tokens=64)
    assert huge == token_seconds(args[0], t, 64, args[1], args[2], max_new_tokens=64)
    assert 0 < huge < 1.0 and token_seconds(args[0], t, 10**9, args[1], args[2]) > 1e6 * huge
