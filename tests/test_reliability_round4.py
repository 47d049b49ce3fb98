"""Reliability, round 4: a model's config.json typed before anything is built from it (the loader, ``pipeline
prepare``, the EAGLE and EAGLE-3 checkpoint readers, the preflight), journal lines resumed only as samples of their
cell (ids of the vocabulary, an output that is their text), a cell's method arguments and a SLURM profile's
resources checked: each mistake one line naming the value and what is accepted, never a traceback."""

from __future__ import annotations

import json
import shutil

import pytest
import yaml

from pipeline.errors import UserError
from pipeline.experiment.cell import Cell, CellFile
from pipeline.models import ModelError
from pipeline.models.config_json import MAX_MATRIX, config_json_problems

from .conftest import tiny_llama

BASE = {  # a whole config.json, as transformers writes a small Llama's
    "model_type": "llama",
    "vocab_size": 49152,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "hidden_act": "silu",
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "torch_dtype": "float32",
}

BAD = [  # (changes to BASE, the key its one line names)
    ({"num_hidden_layers": -2}, "num_hidden_layers=-2"),
    ({"num_hidden_layers": 0}, "num_hidden_layers=0"),
    ({"num_hidden_layers": True}, "num_hidden_layers=true"),
    ({"num_hidden_layers": "2"}, 'num_hidden_layers="2"'),
    ({"num_hidden_layers": 2.0}, "num_hidden_layers=2.0"),
    ({"num_hidden_layers": float("nan")}, "num_hidden_layers=NaN"),
    ({"num_hidden_layers": float("inf")}, "num_hidden_layers=Infinity"),
    ({"num_hidden_layers": [2]}, "num_hidden_layers=[2]"),
    ({"hidden_size": 66}, "hidden_size=66"),  # 4 heads do not divide it
    ({"num_key_value_heads": 3}, "num_key_value_heads=3"),
    ({"head_dim": 0}, "head_dim=0"),
    ({"hidden_act": "swishy"}, 'hidden_act="swishy"'),
    ({"torch_dtype": "float1024"}, 'torch_dtype="float1024"'),
    ({"vocab_size": 2**40}, "vocab_size=1099511627776"),
    ({"hidden_size": 4096, "intermediate_size": 10_000_000}, "intermediate_size=10000000"),
    ({"hidden_size": 1_000_000, "num_attention_heads": 4}, "vocab_size=49152"),  # 4.9e10 elements in one matrix
    ({"rope_theta": float("nan")}, "rope_theta=nan"),
    ({"rms_norm_eps": float("inf")}, "rms_norm_eps=Infinity"),
    ({"rope_scaling": {"factor": -1}}, "rope_scaling="),
]


def test_the_base_config_json_is_accepted():
    assert config_json_problems(BASE, "config.json") == []


@pytest.mark.parametrize(("change", "says"), BAD, ids=[s for _, s in BAD])
def test_a_config_json_value_no_model_can_be_built_from_is_one_line_naming_it(change, says):
    (problem,) = config_json_problems({**BASE, **change}, "model config m/config.json")
    assert problem.startswith("model config m/config.json: ") and says in problem and "\n" not in problem
    assert "accepted" in problem


def test_a_matrix_past_the_bound_says_the_bound():
    (problem,) = config_json_problems({**BASE, "vocab_size": 9_000_000, "hidden_size": 4096}, "c")
    assert f"at most {MAX_MATRIX:,}" in problem and "fit in memory" in problem


def tiny_copy(tiny_dir, tmp_path, **change):
    """A copy of the tiny model whose config.json has ``change``."""
    out = tmp_path / "model"
    shutil.copytree(tiny_dir, out)
    config = json.loads((out / "config.json").read_text())
    (out / "config.json").write_text(json.dumps({**config, **change}))
    return out


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"num_hidden_layers": -2}, "num_hidden_layers=-2"),
        ({"torch_dtype": "float1024"}, 'torch_dtype="float1024"'),
        ({"hidden_act": "swishy"}, 'hidden_act="swishy"'),
        ({"num_key_value_heads": 3}, "num_key_value_heads=3"),  # 2 heads: 3 key-value heads do not divide them
        ({"num_hidden_layers": float("nan")}, "num_hidden_layers=NaN"),
    ],
    ids=["layers", "dtype", "act", "heads", "nan"],
)
def test_the_model_loader_refuses_a_config_json_before_it_builds_the_model(tiny_dir, tmp_path, change, says):
    from pipeline.models import load

    path = tiny_copy(tiny_dir, tmp_path, **change)
    with pytest.raises(ModelError) as err:
        load(path)
    assert says in str(err.value) and "\n" not in str(err.value) and str(path / "config.json") in str(err.value)


def test_pipeline_prepare_alone_refuses_a_model_of_minus_two_layers(tiny_dir, tmp_path, capsys):
    from pipeline.cli import main

    path = tiny_copy(tiny_dir, tmp_path, num_hidden_layers=-2)
    out = tmp_path / "record.json"
    assert main(["prepare", json.dumps({"name": "m", "source": str(path)}), str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: model config ") and "num_hidden_layers=-2 is not accepted" in err, err
    assert "\n" not in err and not out.exists()


@pytest.mark.parametrize(
    ("change", "says"),
    [({"hidden_act": "swishy"}, 'hidden_act="swishy"'), ({"num_attention_heads": True}, "num_attention_heads=true")],
    ids=["act", "bool"],
)
def test_an_eagle_checkpoints_config_json_is_typed_before_its_weights_are_read(tmp_path, change, says):
    """Its directory is refused when a config names it (``head_dir_problem``), and by the loader before a tensor
    is read (the weight file here is no weight file at all)."""
    from pipeline.models.head_files import head_dir_problem, load_head

    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 16, "num_attention_heads": 2, **change}))
    (tmp_path / "model.safetensors").write_bytes(b"not a weight file")
    problem = head_dir_problem(tmp_path)
    assert problem is not None and says in problem and "\n" not in problem
    with pytest.raises(ModelError, match="feature head checkpoint config") as err:
        load_head(tmp_path, tiny_llama(0))
    assert says in str(err.value) and "\n" not in str(err.value)


# ---- journal lines resumed as samples ---------------------------------------------------------------------------


def tamper_row(row: dict, how: str) -> dict:
    if how == "huge id":
        return {**row, "token_ids": [*row["token_ids"][:-1], 10**12]}
    if how == "negative id":
        return {**row, "token_ids": [-5, *row["token_ids"][1:]]}
    if how == "string ids":
        return {**row, "token_ids": "".join(map(str, row["token_ids"]))}
    return {**row, "output": row["output"] + " and more"}  # not the ids' text


SAYS = {
    "huge id": "'token_ids' holds 1000000000000, outside the vocabulary",
    "negative id": "'token_ids' holds -5, outside the vocabulary",
    "string ids": "'token_ids' is not a list of token ids (str)",
    "not the text": "'output' is not the text of its token_ids",
}


@pytest.fixture(scope="module")
def generated(tiny_dir, tmp_path_factory):
    """A finished cell of three greedy samples: (its cell, its samples file's lines)."""
    from pipeline.job.generate import run_cell
    from pipeline.models import ModelSpec

    cell = Cell(
        models=[ModelSpec("a", str(tiny_dir))], method="large_model", task="humaneval", size=3, max_new_tokens=6
    )
    out = tmp_path_factory.mktemp("cell") / "cell.jsonl"
    run_cell(cell, out, progress=False, speed=False)
    return cell, out.read_text().splitlines()


@pytest.mark.parametrize("how", list(SAYS))
def test_a_journal_line_that_is_no_sample_of_the_cell_is_dropped_with_a_warning_and_generated_again(
    generated, tmp_path, capsys, how
):
    from pipeline.job.generate import run_cell

    cell, lines = generated
    rows = [json.loads(line) for line in lines]
    assert all(r["token_ids"] and r["output"] for r in rows[:2])  # something to tamper with
    journal = tmp_path / "cell.jsonl"
    journal.write_text("\n".join([json.dumps(tamper_row(rows[0], how)), lines[1]]) + "\n")  # the third: not made
    capsys.readouterr()
    run_cell(cell, journal, progress=False, speed=False)
    again = [json.loads(line) for line in journal.read_text().splitlines()]
    assert [r["id"] for r in again] == [r["id"] for r in rows]
    for got, want in zip(again, rows):  # greedy: the dropped prompt generated again, as it was the first time
        assert (got["token_ids"], got["output"]) == (want["token_ids"], want["output"])
    assert journal.read_text().splitlines()[1] == lines[1]  # the good line kept byte for byte, not generated again
    warnings = [w for w in capsys.readouterr().err.splitlines() if w.startswith("warning:")]
    assert len(warnings) == 1 and f"{journal} line 1: {SAYS[how]}" in warnings[0], warnings
    assert "generated again" in warnings[0]
    (rejected,) = [json.loads(line) for line in (tmp_path / "cell.jsonl.rejected").read_text().splitlines()]
    assert rejected["line"] == 1 and SAYS[how] in rejected["reason"]


def test_a_sample_over_the_union_of_two_tokenizers_is_checked_as_the_decoder_writes_it():
    """Models of different tokenizers decode over the union of their vocabularies: a resumed sample's ids are
    the union's and its output the union's text of them, as ``generate`` made it (a sample of the first
    tokenizer's text alone would be refused)."""
    from pipeline.decoding import generate
    from pipeline.decoding.union import check_joinable
    from pipeline.job.generate import ids_problem

    from .union_fixtures import gpt_style, sp_style

    a, b = gpt_style(), sp_style()
    models = [tiny_llama(1, vocab=len(a), init=0.6), tiny_llama(2, vocab=len(b), init=0.6)]
    made = generate(models, a.encode("def f"), "we", max_new_tokens=12, tokenizers=[a, b])
    union = check_joinable([a, b])  # a sample's ids and text, as our engine's runs give them (engines/ours.py)
    vocab, text = union.size, union.text
    assert vocab > len(a) and made.token_ids and max(made.token_ids) < vocab
    assert ids_problem({"token_ids": made.token_ids, "output": made.text}, "", vocab, text) is None
    assert "outside the vocabulary" in ids_problem({"token_ids": [vocab], "output": ""}, "", vocab, text)


# ---- a cell's arguments, a profile's resources -------------------------------------------------------------------


@pytest.mark.parametrize("key", ["method_args", "baseline_args"])
@pytest.mark.parametrize("value", [[1], 5, "lambda=0.5", None])
def test_method_args_that_are_no_object_are_one_line_when_a_cell_file_is_read(key, value):
    cell = {"models": ["a"], "method": "large_model", "task": "humaneval", key: value}
    if key == "baseline_args":
        cell["baseline"] = "large_model"
    with pytest.raises(UserError) as err:
        CellFile.from_json({"cell": cell})
    said = str(err.value)
    assert said.startswith(f"{key}={json.dumps(value)} is not accepted; expected an object") and "\n" not in said


def test_pipeline_generate_refuses_method_args_of_a_list_in_one_line(tmp_path, capsys):
    from pipeline.cli import main

    cell = {"models": [{"name": "a", "source": "bundled"}], "method": "large_model", "task": "humaneval"}
    (tmp_path / "cell.json").write_text(json.dumps({"cell": {**cell, "method_args": [1]}}))
    assert main(["generate", str(tmp_path / "cell.json"), str(tmp_path / "out.jsonl")]) == 2
    err = capsys.readouterr().err.strip()
    assert (
        err == 'error: method_args=[1] is not accepted; expected an object of named arguments, such as {"lambda": 0.5}'
    )


@pytest.mark.parametrize(
    ("resources", "says"),
    [
        ({"gpu_model": 5}, "gpu_model=5 is not a GPU name"),
        ({"gpu_model": "tpu-v9"}, 'gpu_model="tpu-v9" is not a GPU of the table; accepted: a100-40gb'),
        ({"gpu_model": "a100", "mem_mb": "lots"}, 'mem_mb="lots" is not accepted (megabytes, a number above 0)'),
        ({"gpu_model": "a100", "mem_mb": True}, "mem_mb=true is not accepted"),
        ({"gpu_model": "a100", "mem_mb": -1}, "mem_mb=-1 is not accepted"),
    ],
    ids=["number", "unknown", "text", "bool", "negative"],
)
def test_a_profiles_gpu_model_and_mem_mb_are_one_line_never_read_as_absent(tmp_path, capsys, resources, says):
    from pipeline.cli import main

    config = {"models": {"a": {"source": "bundled"}}, "grids": [{"name": "g", "model_sets": {"one": ["a"]}}]}
    config["grids"][0]["methods"] = ["large_model"]
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    profile = tmp_path / "profile.yaml"
    profile.write_text(yaml.safe_dump({"set-resources": {"generate": resources}}))
    assert main(["preflight", str(tmp_path / "config.yaml"), "--profile", str(profile)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: profile {profile}: set-resources.generate.") and says in err, err
    assert "\n" not in err


# ---- full disks and shared caches: a cache directory written whole, with the umask's permissions ----------------


def _stopped_by(err: BaseException):
    def write(tmp):
        (tmp / "model.safetensors").write_bytes(b"half")
        raise err

    return write


@pytest.mark.parametrize(
    "err",
    [
        OSError(28, "No space left on device"),
        OSError(122, "Disk quota exceeded"),
        RuntimeError(
            'Error while serializing: IoError(Os { code: 28, kind: StorageFull, message: "No space left on device" })'
        ),
    ],
    ids=["enospc", "quota", "a-librarys-own-error"],
)
def test_a_full_disk_while_a_model_is_saved_is_one_line_and_leaves_no_temporary_directory(tmp_path, err):
    """safetensors reports a full disk with an error of its own (not an OSError): it too is one line, and neither
    the temporary directory nor a half-written model is left in the cache."""
    from pipeline.models.cache import write_dir
    from pipeline.models.spec import ModelError

    out = tmp_path / "cache" / "draft"
    with pytest.raises(ModelError) as caught:
        write_dir(out, _stopped_by(err), {"draft.json": "{}"})
    assert str(caught.value).count("\n") == 0 and "no space left on its device" in str(caught.value)
    assert list((tmp_path / "cache").iterdir()) == []


def test_an_interrupted_save_leaves_no_temporary_directory_and_is_not_mistaken_for_a_full_disk(tmp_path):
    from pipeline.models.cache import write_dir

    with pytest.raises(KeyboardInterrupt):
        write_dir(tmp_path / "draft", _stopped_by(KeyboardInterrupt()))
    with pytest.raises(ValueError, match="a bug"):
        write_dir(tmp_path / "draft", _stopped_by(ValueError("a bug")))
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("mask, mode", [(0o002, 0o775), (0o022, 0o755), (0o077, 0o700)])
def test_a_cache_directory_takes_the_umasks_permissions_so_a_group_can_share_it(tmp_path, mask, mode):
    import os

    from pipeline.models.cache import write_dir

    old = os.umask(mask)
    try:
        write_dir(tmp_path / "draft", lambda tmp: (tmp / "config.json").write_text("{}"))
    finally:
        os.umask(old)
    assert (tmp_path / "draft").stat().st_mode & 0o777 == mode


# ---- a published head given as a model's eagle: prepared as the workflow prepares it ------------------------------


@pytest.mark.parametrize("layout", ["eagle3", "eagle"])
def test_a_published_checkpoint_given_as_eagle_is_prepared_with_no_draft_json_of_ours(
    tmp_path, smol_tokenizer, capsys, layout
):
    """``pipeline prepare`` (the workflow's ``prepare_model``) on a model whose ``eagle`` is a published EAGLE-3 or
    EAGLE-1 checkpoint: the head is loaded against the model (every check), and the record says what it is, where
    it read a ``draft.json`` only a head trained here has, and told the user to delete their download."""
    from pipeline.cli import main
    from pipeline.models import load

    from .conftest import save_tiny
    from .test_eagle3 import eagle3_checkpoint
    from .test_feature_head import eagle_checkpoint

    model_dir = save_tiny(tmp_path / "model", smol_tokenizer, layers=4)
    target = load(model_dir, pack=False)[0]
    head = tmp_path / "head"
    if layout == "eagle3":
        eagle3_checkpoint(head, target, aux=[3, 0, 1])
    else:
        eagle_checkpoint(head, target)
    out = tmp_path / "record.json"
    spec = {"name": "m", "source": str(model_dir), "eagle": str(head)}
    assert main(["prepare", json.dumps(spec), str(out)]) == 0, capsys.readouterr().err
    record = json.loads(out.read_text())
    assert record["feature_head"] == {"path": str(head), "kind": "published head", "layout": layout}
    assert not (head / "draft.json").exists()  # nothing written into the user's download


# ---- pipeline status: a job's log read as itself, never through a symbolic link ---------------------------------


def test_a_log_that_is_a_symbolic_link_is_not_followed_by_status(tmp_path, capsys):
    """A link in place of a job's log (to a file elsewhere, one that names an error) is never read: ``read_tail``
    says in one line that it is a link, and ``pipeline status`` reads it as a log that names no cause (as a pipe
    there), not as the linked file's text; a model's preparation log likewise."""
    import os

    from pipeline.cli import main
    from pipeline.files import read_tail
    from pipeline.report.status import status

    from .test_status import dims

    cell = "humaneval/pair/sd-T0-g2"
    res = tmp_path / "results"
    res.mkdir()
    (res / "grid.json").write_text(json.dumps([dims(cell)]))
    elsewhere = tmp_path / "elsewhere.txt"
    elsewhere.write_text("error: a secret line of a file outside the results directory\n")
    for log in (res / "logs" / "generate" / f"{cell}.log", res / "logs" / "prepare" / "m.log"):
        log.parent.mkdir(parents=True)
        log.symlink_to(elsewhere)
    with pytest.raises(UserError) as err:
        read_tail(res / "logs" / "generate" / f"{cell}.log", "log")
    said = str(err.value)
    assert "is a symbolic link; links are not followed" in said and "\n" not in said and "secret" not in said
    s = status(res)
    assert s.failed == {} and s.running == [cell]  # the linked file's error line is not the cell's cause
    assert main(["status", str(res)]) == 0
    assert "secret" not in capsys.readouterr().out
    os.unlink(res / "logs" / "generate" / f"{cell}.log")  # the file itself there: its cause is read
    (res / "logs" / "generate" / f"{cell}.log").write_text("error: the disk is full\n")
    assert status(res).failed == {cell: "generate: error: the disk is full"}


@pytest.mark.parametrize("layout", ["eagle3", "eagle"])
def test_a_published_checkpoint_given_as_eagle_runs_through_prepare_and_generate_losslessly(
    tmp_path, smol_tokenizer, capsys, layout
):
    """The workflow's two steps on a model whose ``eagle`` is a published EAGLE-3 (or EAGLE-1) checkpoint:
    ``pipeline prepare`` (rule ``prepare_model``), then ``pipeline generate`` (rule ``generate``) of a cell whose
    method drafts from that head (``sd`` with proposer ``eagle``), in float64: every sample is the target's plain
    greedy decoding (a cell of ``large_model`` alone), token for token, as is its baseline beside it; the head
    proposed, and the EAGLE-3 head (its draft vocabulary the tokens the target writes) had proposals accepted."""
    from pipeline.cli import main
    from pipeline.models import load

    from .conftest import save_tiny
    from .test_eagle3 import eagle3_checkpoint
    from .test_feature_head import eagle_checkpoint

    model_dir = save_tiny(tmp_path / "model", smol_tokenizer, layers=4)
    plain = {"name": "m", "source": str(model_dir), "dtype": "float64"}
    common = {"task": "humaneval", "size": 3, "max_new_tokens": 12}

    def generated(name: str, cell: dict) -> list[dict]:
        (tmp_path / f"{name}.json").write_text(json.dumps({"cell": {**common, **cell}}))
        out = tmp_path / f"{name}.jsonl"
        assert main(["generate", str(tmp_path / f"{name}.json"), str(out)]) == 0, capsys.readouterr().err
        return [json.loads(line) for line in out.read_text().splitlines()]

    greedy = generated("plain", {"models": [plain], "method": "large_model"})
    target = load(model_dir, pack=False)[0]
    head = tmp_path / "head"
    if layout == "eagle3":
        eagle3_checkpoint(head, target, ids=sorted({t for r in greedy for t in r["token_ids"]}), aux=[3, 0, 1])
    else:
        eagle_checkpoint(head, target)
    spec = {**plain, "eagle": str(head)}
    assert main(["prepare", json.dumps(spec), str(tmp_path / "record.json")]) == 0, capsys.readouterr().err
    method = {"method": "sd", "gamma": 3, "method_args": {"proposer": "eagle"}, "baseline": "large_model"}
    drafted = generated("sd", {"models": [spec], **method})
    assert len(drafted) == len(greedy) == 3
    for got, want in zip(drafted, greedy):
        assert got["id"] == want["id"] and got["token_ids"] and got["stats"]["method"] == "sd"
        assert got["token_ids"] == got["baseline"]["token_ids"] == want["token_ids"]  # lossless
        assert got["output"] == want["output"]
    proposed = [r["stats"]["proposers"]["eagle"] for r in drafted]
    assert sum(p["proposed"] for p in proposed) > 0
    if layout == "eagle3":
        assert sum(p["accepted"] for p in proposed) > 0
    assert not (head / "draft.json").exists()
