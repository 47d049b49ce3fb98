"""Every bad input is refused with one clear ValueError before any decoding."""

from __future__ import annotations

import pytest

from pipeline.decoding import generate

from .conftest import tiny_llama

PROMPT = [1, 2, 3]


@pytest.fixture(scope="module")
def models():
    return [tiny_llama(50), tiny_llama(51), tiny_llama(52)]


@pytest.fixture()
def counted(models):
    """Count forward calls, to prove nothing was decoded before the error."""
    calls = []
    handles = [m.register_forward_hook(lambda *a: calls.append(1)) for m in models]
    yield calls
    for h in handles:
        h.remove()


CASES = [
    # (kwargs, index of models used, words the message must contain)
    ({"method": "beam_search"}, 2, ["unknown method 'beam_search'", "we_se"]),
    ({"method": "sd", "gamma": 0}, 2, ["gamma=0", ">= 1"]),
    ({"method": "we_se", "gamma": -2}, 2, ["gamma=-2"]),
    ({"method": "we_se", "gamma": [1, 2, 3]}, 2, ["gamma=[1, 2, 3]", "expected 2 ints"]),
    ({"method": "we_se", "gamma": [1, 0]}, 2, ["gamma=[1, 0]"]),
    ({"method": "sd", "gamma": [1, 2]}, 2, ["a list is for *_se methods"]),
    ({"method": "we_sd", "gamma": 2.5}, 2, ["gamma=2.5"]),
    ({"method": "we", "method_args": {"lambda": 1.5}}, 2, ["lambda=1.5", "[0, 1]"]),
    ({"method": "we_se", "method_args": {"lambda": -0.1}}, 2, ["lambda=-0.1"]),
    ({"method": "we", "method_args": {"lambda": 0.5}}, 3, ["'lambda' needs exactly 2 models"]),
    ({"method": "we", "method_args": {"weights": [1, 2]}}, 3, ["expected 3 finite non-negative numbers"]),
    ({"method": "cd", "method_args": {"lambda": 0.5}}, 2, ["unknown method_args ['lambda']", "alpha, beta"]),
    ({"method": "cd", "method_args": {"alpha": -1}}, 2, ["alpha=-1"]),
    ({"method": "cd", "method_args": {"beta": 2}}, 2, ["beta=2"]),
    ({"method": "cd"}, 3, ["'cd' needs 2 models, got 3"]),
    ({"method": "sd"}, 3, ["'sd' needs 2 models"]),
    ({"method": "we"}, 1, ["'we' needs 2 or more models, got 1"]),
    ({"method": "sd", "method_args": {"first_proposer": 1}}, 2, ["unknown method_args ['first_proposer'] for 'sd'"]),
    ({"method": "we_se", "method_args": {"first_proposer": 5}}, 2, ["first_proposer=5", "0..1"]),
    ({"method": "sd", "method_args": {"proposer": "ngram"}}, 2, ["proposer='ngram'", "lookup+draft"]),
    ({"method": "we", "method_args": {"proposer": "lookup"}}, 2, ["unknown method_args ['proposer'] for 'we'"]),
    ({"method": "we_me"}, 2, ["temperature=0.0 for 'we_me'", "temperature > 0", "'we'"]),
    ({"method": "we_me", "temperature": 1.0, "method_args": {"proposer": "draft"}}, 2, ["unknown method_args"]),
    ({"method": "we_me", "temperature": 1.0, "method_args": {"lambda": 0.5}}, 3, ["'lambda' needs exactly 2"]),
    ({"method": "cd_me", "temperature": 1.0}, 2, ["unknown method 'cd_me'", "we_me"]),
    ({"method": "we_me_sd", "gamma": 2}, 2, ["temperature=0.0 for 'we_me_sd'", "temperature > 0"]),
    ({"method": "we_me_sd", "temperature": 1.0, "method_args": {"proposer": "lookup"}}, 2, ["expected one of draft"]),
    ({"method": "we_me_sd", "temperature": 1.0, "gamma": [1, 2]}, 2, ["a list is for *_se methods"]),
    ({"method": "large_model", "temperature": -1}, 2, ["temperature=-1"]),
    ({"method": "large_model", "top_p": 0.0}, 2, ["top_p=0.0", "(0, 1]"]),
    ({"method": "large_model", "top_k": -3}, 2, ["top_k=-3"]),
    ({"method": "large_model", "max_new_tokens": -1}, 2, ["max_new_tokens=-1"]),
    ({"method": "large_model", "stop_strings": ["\n"]}, 2, ["stop_strings need a tokenizer"]),
    # non-finite numbers and values of the wrong type, each named
    ({"method": "large_model", "temperature": float("nan")}, 2, ["temperature=nan", "finite"]),
    ({"method": "large_model", "temperature": float("inf")}, 2, ["temperature=inf", "finite"]),
    ({"method": "large_model", "top_p": float("nan")}, 2, ["top_p=nan"]),
    ({"method": "we", "method_args": {"weights": [float("nan"), 1]}}, 2, ["weights=[nan, 1]", "finite"]),
    ({"method": "we", "method_args": {"weights": [float("inf"), 1]}}, 2, ["weights=[inf, 1]"]),
    ({"method": "we", "method_args": {"weights": [1e308, 1e308]}}, 2, ["sum must be positive and finite"]),
    ({"method": "we", "method_args": {"weights": "1,1"}}, 2, ["weights='1,1'"]),
    ({"method": "we", "method_args": {"lambda": float("nan")}}, 2, ["lambda=nan"]),
    ({"method": "cd", "method_args": {"alpha": float("nan")}}, 2, ["alpha=nan", "finite"]),
    ({"method": "cd", "method_args": {"alpha": float("inf")}}, 2, ["alpha=inf"]),
    ({"method": "cd", "method_args": {"beta": float("nan")}}, 2, ["beta=nan"]),
    ({"method": "large_model", "eos_token_id": 1.5}, 2, ["eos_token_id=1.5"]),
    ({"method": "large_model", "eos_token_id": "x"}, 2, ["eos_token_id='x'"]),
    ({"method": "large_model", "eos_token_id": [2, None]}, 2, ["eos_token_id=[2, None]"]),
    ({"method": "large_model", "seed": 2**70}, 2, ["seed=1180591620717411303424", "0..2**64-1"]),
    ({"method": "large_model", "seed": -1}, 2, ["seed=-1"]),
    ({"method": "large_model", "seed": 1.0}, 2, ["seed=1.0"]),
    ({"method": "large_model", "method_args": "lambda=0.5"}, 2, ["method_args='lambda=0.5'"]),
]


@pytest.mark.parametrize("kwargs,n,words", CASES, ids=[str(c[0]) for c in CASES])
def test_bad_input_is_refused_before_decoding(models, counted, kwargs, n, words):
    with pytest.raises(ValueError) as err:
        generate(models[:n], PROMPT, **kwargs)
    message = str(err.value)
    assert "\n" not in message
    for w in words:
        assert w in message
    assert not counted


def test_different_vocabularies_are_refused(counted):
    a, b = tiny_llama(60, vocab=32), tiny_llama(61, vocab=40)
    with pytest.raises(ValueError, match=r"different vocabularies \(model 0: 32, model 1: 40\)"):
        generate([a, b], PROMPT, "we_se")
    # a padded embedding matrix is fine once the shared size is given; extra ids are masked
    out = generate([a, b], PROMPT, "we_se", gamma=2, vocab_size=32, max_new_tokens=10)
    assert len(out.token_ids) == 10 and max(out.token_ids) < 32


@pytest.mark.parametrize(
    "prompt, words",
    [
        ([1, 32, 3], "prompt_ids holds 32, outside the vocabulary: expected ids in 0..31"),
        ([1, -1], "holds -1"),
        ([1, 2.0], "int token ids"),
        (5, "prompt_ids=5"),
    ],
)
def test_prompt_ids_outside_the_vocabulary_are_refused_before_decoding(models, counted, prompt, words):
    with pytest.raises(ValueError) as err:
        generate(models[:2], prompt, "we_se")
    assert words in str(err.value) and "\n" not in str(err.value)
    assert not counted


def test_empty_prompt_and_empty_model_list(models):
    with pytest.raises(ValueError, match="prompt_ids"):
        generate(models[:1], [], "large_model")
    with pytest.raises(ValueError, match="non-empty list"):
        generate([], PROMPT, "large_model")


def test_damaged_model_files_get_one_line(tiny_dir, tmp_path, capsys):
    import json
    import shutil

    from pipeline.cli import main

    damaged = tmp_path / "damaged"
    shutil.copytree(tiny_dir, damaged)
    (damaged / "model.safetensors").write_bytes(b"not a model")
    spec = json.dumps({"name": "damaged", "source": str(damaged)})
    assert main(["prepare", spec, str(tmp_path / "damaged.json")]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and f"model directory {damaged} could not be loaded: SafetensorError" in lines[0], lines
    assert not (tmp_path / "damaged.json").exists()


def test_an_error_that_echoes_a_huge_value_is_cut_to_one_readable_line_keeping_its_reason(tmp_path, capsys):
    from pipeline.cli import main
    from pipeline.errors import MAX_MESSAGE

    assert main(["grid", str(tmp_path / ("x" * 40_000))]) == 2  # a config path echoed whole before
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and len(err) <= MAX_MESSAGE + len("error: ")
    assert "characters cut) ... " in err and err.endswith(": File name too long")  # the reason is kept


@pytest.mark.parametrize(
    "spec, said",
    [
        ('{"name": "a", "source": 1}', "model 'a': source=1 is not accepted; expected str or null"),
        ('{"name": "a", "full_head": 1}', "model 'a': full_head=1 is not accepted; expected bool"),
        ('{"name": "a", "distill": [1]}', "model 'a': distill=[1] is not accepted; expected a mapping or null"),
        ('{"name": "a", "eagle": 3}', "model 'a': eagle=3 is not accepted; expected str or a mapping or null"),
    ],
)
def test_a_model_spec_of_the_wrong_types_is_one_line(tmp_path, capsys, spec, said):
    from pipeline.cli import main

    assert main(["prepare", spec, str(tmp_path / "m.json")]) == 2
    assert capsys.readouterr().err.strip() == f"error: {said}"


RENAMED = "model 'smollm2-135m-instruct': key 'engine' is now 'runner' (eager, compiled or compiled+autotune)"


def test_a_model_that_still_names_its_engine_is_told_the_new_key_in_one_line(tmp_path, capsys):
    """``engine:`` of a model is ``runner:`` now: a config and a model spec that still say it get one line; a cell
    file written before the rename (a record, not a user's words) reads as the new key."""
    import yaml

    from pipeline.cli import main
    from pipeline.experiment.cell import Cell
    from pipeline.experiment.config import ConfigError, check_config
    from pipeline.models.spec import DEFAULT_CONFIG

    config = yaml.safe_load(DEFAULT_CONFIG.read_text())
    config["models"]["smollm2-135m-instruct"]["engine"] = "compiled"
    with pytest.raises(ConfigError) as err:
        check_config(config)
    assert str(err.value) == RENAMED
    spec = '{"name": "smollm2-135m-instruct", "engine": "eager"}'
    assert main(["prepare", spec, str(tmp_path / "m.json")]) == 2
    assert capsys.readouterr().err.strip() == f"error: {RENAMED}"
    old = Cell.from_json(
        {"models": [{"name": "smollm2-135m-instruct", "engine": "compiled"}], "method": "sd", "task": "humaneval"}
    )
    assert old.models[0].runner == "compiled" and "engine" not in old.models[0].__dict__
