"""What cannot be right is refused in one line: extension points checked where they meet the decoder, inputs
checked before the first forward, one generation job per cell, unreadable user files named."""

from __future__ import annotations

import json
import os
import re
import signal

import pytest
import torch

from pipeline.decoding import generate
from pipeline.decoding.ensembles import EnsembleOutputError, register_ensemble
from pipeline.decoding.member import Member
from pipeline.errors import ArgumentError, UserError

from .conftest import perturbed, tiny_llama
from .test_journal import hold

VOCAB = 32  # tiny_llama's vocabulary


@pytest.fixture(scope="module")
def pair():
    target = tiny_llama(0)
    return [target, perturbed(target, 0.05, seed=1)]


# ---- registered ensembles: their output checked on every call --------------------------------------------


@register_ensemble("rel_nan", test_args=None)  # wrong on purpose
def _nan_ensemble(logits, sampling):
    return torch.full_like(logits[0], float("nan"))


@register_ensemble("rel_neginf", test_args=None)  # wrong on purpose
def _neginf_ensemble(logits, sampling):
    return torch.full_like(logits[0], float("-inf"))


@register_ensemble("rel_narrow", test_args=None)  # wrong on purpose
def _narrow_ensemble(logits, sampling):
    return torch.softmax(logits[0][:, :5], dim=-1)


@register_ensemble("rel_int", test_args=None)  # wrong on purpose
def _int_ensemble(logits, sampling):
    return torch.ones(logits[0].shape, dtype=torch.long)


@register_ensemble("rel_negative", test_args=None)  # wrong on purpose
def _negative_ensemble(logits, sampling):  # a positive sum, one negative entry: no distribution
    row = torch.softmax(logits[0], dim=-1)
    row[:, 0] = -0.01
    return row


@pytest.mark.parametrize(
    ("name", "said"),
    [
        ("rel_nan", "NaN entries"),
        ("rel_neginf", "no finite entry"),
        ("rel_narrow", rf"shape \((\d+), 5\), expected \(\1, {VOCAB}\)"),
        ("rel_int", "dtype torch.int64"),
        ("rel_negative", r"negative entries \(expected probabilities >= 0\)"),
    ],
)
@pytest.mark.parametrize(("suffix", "temperature"), [("", 0.0), ("", 1.0), ("_se", 0.0), ("_se", 1.0)])
def test_a_broken_ensemble_is_one_line_naming_it_and_the_step(pair, name, said, suffix, temperature):
    with pytest.raises(EnsembleOutputError, match=f"ensemble {name!r} at step 0 returned .*{said}") as err:
        generate(pair, [1, 2, 3], f"{name}{suffix}", gamma=2, max_new_tokens=6, temperature=temperature)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    ("method", "kwargs", "blamed"),
    [
        ("we", {"temperature": 5e-324}, "temperature=5e-324 takes the logits divided by it beyond"),
        ("large_model", {"temperature": 1e-320}, "temperature=1e-320 takes the logits"),
        ("cd", {"method_args": {"alpha": 1e308}}, "alpha=1e+308 takes the scores beyond"),
        ("cd_sd", {"method_args": {"alpha": 1e308}, "temperature": 1.0}, "alpha=1e+308 takes the scores beyond"),
    ],
)
def test_a_fault_of_the_settings_names_the_setting_not_the_ensemble(pair, method, kwargs, blamed):
    with pytest.raises(EnsembleOutputError, match="from finite logits: " + re.escape(blamed)) as err:
        generate(pair, [1, 2, 3], method, max_new_tokens=4, **kwargs)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_broken_ensemble_at_plain_settings_is_still_blamed_itself(pair, temperature):
    with pytest.raises(EnsembleOutputError) as err:
        generate(pair, [1, 2, 3], "rel_nan", max_new_tokens=4, temperature=temperature)
    assert str(err.value).endswith("returned NaN entries")


def test_the_step_named_is_the_one_that_went_wrong(pair):
    calls = {"n": 0}

    @register_ensemble("rel_turns_nan", test_args=None)
    def turns_nan(logits, sampling):
        calls["n"] += 1
        row = torch.softmax(logits[0], dim=-1)
        return row if calls["n"] <= 3 else row * float("nan")

    with pytest.raises(EnsembleOutputError, match="'rel_turns_nan' at step 3 returned NaN entries"):
        generate(pair, [1, 2, 3], "rel_turns_nan", max_new_tokens=8)


def test_a_runner_with_rows_of_the_wrong_width_is_one_line():
    class Narrow:
        length, vocab_size = 0, VOCAB

        def extend(self, tokens, keep):
            self.length += len(tokens)
            return torch.zeros(keep, 5)

    with pytest.raises(
        EnsembleOutputError, match=rf"runner Narrow returned \(1, 5\) logits rows, expected \(1, {VOCAB}\)"
    ):
        Member(Narrow()).catch_up([1, 2, 3], 3)


def test_built_in_ensembles_pass_the_check(pair):
    for method in ("we", "we_se", "cd", "gac", "large_model"):
        args = {"alpha": 0.1} if method == "cd" else {}
        out = generate(pair, [1, 2, 3], method, gamma=2, max_new_tokens=5, temperature=0.7, method_args=args)
        assert len(out.token_ids) == 5


# ---- inputs refused before the first forward -------------------------------------------------------------


def forwards(model):
    calls = []
    handle = model.register_forward_pre_hook(lambda *_: calls.append(1))
    return calls, handle


def test_an_eos_id_outside_the_vocabulary_is_refused(pair):
    calls, handle = forwards(pair[0])
    try:
        with pytest.raises(ArgumentError, match=f"eos_token_id=99: 99 is outside the vocabulary of {VOCAB}"):
            generate(pair, [1, 2], "we", eos_token_id=99)
        with pytest.raises(ArgumentError, match="40 is outside the vocabulary"):
            generate(pair, [1, 2], "large_model", eos_token_id=[3, 40])
    finally:
        handle.remove()
    assert not calls
    generate(pair, [1, 2], "we", eos_token_id=VOCAB - 1, max_new_tokens=2)  # the last id is inside


def test_a_prompt_beyond_the_context_is_refused_naming_the_model_and_its_limit():
    short = tiny_llama(3)
    short.config.max_position_embeddings = 32
    long_prompt = list(range(1, 31)) + list(range(1, 19))  # 48 tokens
    with pytest.raises(ArgumentError, match=r"48 tokens .* model 0 \(LlamaForCausalLM\) holds 32"):
        generate([short], long_prompt, "large_model", max_new_tokens=0)
    with pytest.raises(ArgumentError, match=r"30 tokens plus max_new_tokens=8 needs 38 positions.*holds 32"):
        generate([short], list(range(30)), "large_model", max_new_tokens=8)
    assert len(generate([short], list(range(30)), "large_model", max_new_tokens=2).token_ids) == 2  # fits: 32


def test_only_the_models_a_method_runs_bound_its_context(pair):
    short = tiny_llama(3)
    short.config.max_position_embeddings = 8
    generate([pair[0], short], list(range(10)), "large_model", max_new_tokens=2)  # the short model does not run
    with pytest.raises(ArgumentError, match=r"model 1 .* holds 8"):
        generate([pair[0], short], list(range(10)), "we", max_new_tokens=2)


def test_a_model_on_the_meta_device_is_refused():
    with torch.device("meta"):
        ghost = tiny_llama(4)
    with pytest.raises(ArgumentError, match="model 0 .* weights on the 'meta' device"):
        generate([ghost], [1, 2], "large_model")


# ---- files the user gives -----------------------------------------------------------------------------------


def test_a_config_that_is_not_utf8_is_one_line_naming_it(tmp_path):
    from pipeline.experiment.config import ConfigError
    from pipeline.experiment.config_file import load_config_file

    bad = tmp_path / "config.yaml"
    bad.write_bytes(b"methods:\n  - we\n\xff\xfe\n")
    with pytest.raises(ConfigError, match=rf"config file {bad} is not UTF-8 text \(byte 0xff on line 3\)"):
        load_config_file(bad)
    with pytest.raises(ConfigError, match=rf"config file {tmp_path} is a directory"):
        load_config_file(tmp_path)
    with pytest.raises(ConfigError, match="config file /dev/zero is not a regular file"):
        load_config_file("/dev/zero")


def test_unreadable_user_files_are_one_line(tmp_path):
    from pipeline.files import read_jsonl, read_user_bytes

    big = tmp_path / "big.json"
    big.write_bytes(b"x" * 100)
    with pytest.raises(UserError, match=rf"cell file {big} is too large \(100 bytes; at most 10"):
        read_user_bytes(big, "cell file", limit=10)
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    with pytest.raises(UserError, match="is not a regular file"):  # never blocks waiting for a writer
        read_user_bytes(fifo)
    with pytest.raises(UserError, match="No such file"):
        read_user_bytes(tmp_path / "absent")
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"a": 1}\n\n{"b": \n')
    with pytest.raises(UserError, match=rf"JSONL file {rows} line 3 is not valid JSON"):
        read_jsonl(rows)


def test_the_cli_and_score_name_a_file_that_is_not_utf8(tmp_path, capsys):
    from pipeline.cli import main

    bad = tmp_path / "cell.json"
    bad.write_bytes(b'{"cell": "\xff"}')
    assert main(["generate", str(bad), str(tmp_path / "out.jsonl")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"cell file {bad} is not UTF-8 text" in err
    assert main(["score", str(bad), "--task", "humaneval"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"generations file {bad} is not UTF-8 text" in err


@pytest.mark.parametrize(
    "line,message",
    [
        ('{"id": "HumanEval/0", "output": 5}', "output=5 is not accepted (not of type 'string')"),
        ('{"id": 3, "output": "x"}', "id=3 is not accepted (not of type 'string')"),
        ('{"id": "HumanEval/0"}', "'output' is a required property"),
        ('{"id": "HumanEval/0", "output": null}', "output=null is not accepted"),
        ("[1, 2]", "(top level)=[1, 2] is not accepted (not of type 'object')"),
    ],
)
def test_score_refuses_a_generations_line_it_cannot_score_in_one_line(tmp_path, capsys, line, message):
    from pipeline.cli import main

    gens = tmp_path / "g.jsonl"
    gens.write_text('{"id": "HumanEval/0", "output": "pass"}\n' + line + "\n")
    assert main(["score", str(gens), "--task", "humaneval"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{gens}:2: {message}" in err, err
    assert not gens.with_suffix(".scores.jsonl").exists()  # nothing written


# ---- prepare: damaged weights, a missing tokenizer ---------------------------------------------------------


def _prepare(capsys, directory, out):
    from pipeline.cli import main

    code = main(["prepare", json.dumps({"name": "m", "source": str(directory)}), str(out)])
    return code, capsys.readouterr().err.strip().splitlines()


def test_prepare_failures_are_one_line(tmp_path, capsys, tiny_dir):
    import shutil

    no_tokenizer = tmp_path / "no-tokenizer"
    tiny_llama(0).save_pretrained(no_tokenizer)
    code, err = _prepare(capsys, no_tokenizer, tmp_path / "a.json")
    lines = [line for line in err if line.startswith("error:")]
    assert code == 2 and len(lines) == 1 and "has no usable tokenizer" in lines[0]
    assert not lines[0].rstrip().endswith("from one of")  # the whole sentence, not its first line

    damaged = tmp_path / "damaged"
    shutil.copytree(tiny_dir, damaged)
    weights = damaged / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-100])
    code, err = _prepare(capsys, damaged, tmp_path / "b.json")
    lines = [line for line in err if line.startswith("error:")]
    assert code == 2 and len(lines) == 1 and "could not be loaded: SafetensorError" in lines[0]
    assert not any("Traceback" in line for line in err)

    from safetensors.torch import load_file, save_file

    good = load_file(tiny_dir / "model.safetensors")
    save_file({k: v for k, v in good.items() if "layers.1." not in k}, weights, metadata={"format": "pt"})
    code, err = _prepare(capsys, damaged, tmp_path / "c.json")  # weights missing: they would be random
    assert code == 2 and err == [
        f"error: model directory {damaged} could not be loaded: 9 weights are missing "
        "from its files (first: model.layers.1.input_layernorm.weight); the files are "
        "incomplete or of another model"
    ]
    save_file({k: v[..., :4].contiguous() if v.dim() == 2 else v for k, v in good.items()}, weights)
    code, err = _prepare(capsys, damaged, tmp_path / "d.json")  # other shapes: transformers' report is not shown
    assert code == 2 and len(err) == 1 and "tensors of other shapes than its config.json describes" in err[0]
    assert not any((tmp_path / f"{x}.json").exists() for x in "abcd")


# ---- one generation job per cell ---------------------------------------------------------------------------


def test_run_cell_refuses_a_running_cell_and_takes_over_from_a_dead_job(tiny_dir, tmp_path, capsys):
    from pipeline.experiment.cell import Cell
    from pipeline.files import LockHeld
    from pipeline.job.generate import run_cell
    from pipeline.models import ModelSpec

    cell = Cell(
        models=[ModelSpec("a", str(tiny_dir))], method="large_model", task="humaneval", size=2, max_new_tokens=3
    )
    out, journal = tmp_path / "gen" / "cell.jsonl", tmp_path / "journal" / "cell.jsonl"
    run_cell(cell, out, progress=False, journal=tmp_path / "first.jsonl")
    first = out.read_text().splitlines()[0]
    out.unlink()

    proc = hold(journal, first)  # a job that made one sample and is still running
    try:
        with pytest.raises(LockHeld, match=f"in use by pid {proc.pid}"):
            run_cell(cell, out, journal=journal)
        assert not out.exists() and journal.read_text() == first + "\n"  # nothing done twice, nothing lost
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    capsys.readouterr()
    run_cell(cell, out, progress=True, journal=journal)  # takes over and resumes from the journal
    assert "1 of 2 samples already generated" in capsys.readouterr().out
    rows = out.read_text().splitlines()
    assert len(rows) == 2 and rows[0] == first


# ---- the workflow's check: every dataset's longest prompt fits its models' context -------------------------


def test_the_config_check_refuses_prompts_beyond_a_models_context(tmp_path, smol_tokenizer, tiny_dir, capsys):
    from pipeline.experiment.checks import main as grid

    from .conftest import save_tiny

    short = save_tiny(tmp_path / "short", smol_tokenizer)
    config = json.loads((short / "config.json").read_text())
    (short / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 100}))
    data = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "data")
    grid_config = {
        "models": {"long": {"source": str(tiny_dir)}, "short": {"source": str(short)}},
        "grids": [{"name": "g", "model_sets": {"pair": ["long", "short"]}, "methods": ["we"]}],
        "datasets": {"humaneval": {"size": 2}},
        "data_dir": data,
        "max_new_tokens": 16,
        "results": str(tmp_path / "results"),
    }
    path = tmp_path / "config.yaml"
    path.write_text(json.dumps(grid_config))
    capsys.readouterr()
    assert grid([str(path)]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert re.fullmatch(
        r"error: cell humaneval/pair/we-T0: the longest humaneval prompt is (\d+) tokens under model 'short'; "
        r"with max_new_tokens=16 it needs \d+ positions, and 'short' holds 100 \(max_position_embeddings in its "
        r"config.json\); lower max_new_tokens or choose another model",
        line,
    ), line
    (short / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 4096}))
    assert grid([str(path)]) == 0
