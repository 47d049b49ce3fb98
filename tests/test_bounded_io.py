"""Reads bounded (pipeline/files.py): a JSON value nested 100,000 deep or an integer of 5,000 digits, in grid.json, a
cell file, a speed record, a journal line, a JSONL file, a worker's reply or an argument, is one line naming where
it came from, never a RecursionError or int()'s ValueError; a pickle where tensors are read is refused unread; a
journal, grid.json or cell file that is a symbolic link out of the results directory is one line, and nothing of
what it points to is copied into the results."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest

from pipeline.errors import UserError
from pipeline.experiment.cell import GRID, CellFile
from pipeline.files import (
    MAX_JSON_DEPTH,
    MAX_JSON_DIGITS,
    JSONError,
    parse_json,
    read_jsonl,
    read_tensors,
    read_user_json,
)
from pipeline.job.journal import Journal
from pipeline.measure.speed import SPEED_RECORD
from pipeline.records import read_record

DEEP = "[" * 100_000 + "]" * 100_000
LONG = '{"n": ' + "7" * 5_000 + "}"
BOMBS = [(DEEP, f"nested deeper than {MAX_JSON_DEPTH} levels"), (LONG, "holds an integer of 5,000 digits")]


def one_line(err: BaseException, where: Path | str) -> str:
    """The error's text, checked to be one short line naming ``where`` and echoing at most 80 characters of the value
    (an argument's start)."""
    text = str(err)
    assert "\n" not in text and len(text) <= 500 and str(where) in text
    assert "[" * 81 not in text and "7" * 81 not in text
    return text


# ---- the reader itself ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("text, says", BOMBS)
def test_a_bomb_is_one_line_naming_where_it_came_from(text, says):
    with pytest.raises(JSONError) as err:
        parse_json(text, "the thing /x/y.json")
    assert says in one_line(err.value, "the thing /x/y.json")
    assert isinstance(err.value, UserError) and isinstance(err.value, json.JSONDecodeError)


def test_the_bounds_themselves_are_read_and_text_does_not_count():
    deepest = "[" * MAX_JSON_DEPTH + "]" * MAX_JSON_DEPTH
    assert parse_json(deepest, "w") == json.loads(deepest)
    longest = "-" + "9" * MAX_JSON_DIGITS
    assert parse_json(f"[{longest}]", "w") == [int(longest)]
    in_text = json.dumps({"s": "[" * 5_000 + "{" * 5_000, "t": "8" * 5_000, "e": 'a\\"[[[['})
    assert parse_json(in_text, "w") == json.loads(in_text)  # brackets and digits in a string are text
    assert parse_json("[1." + "5" * 5_000 + "]", "w") == [1.5555555555555556]  # a float's digits: float() reads them
    with pytest.raises(JSONError, match="nested deeper"):
        parse_json("[" * (MAX_JSON_DEPTH + 1) + "]" * (MAX_JSON_DEPTH + 1), "w")
    with pytest.raises(JSONError, match=f"integer of {MAX_JSON_DIGITS + 1} digits"):
        parse_json("9" * (MAX_JSON_DIGITS + 1), "w")


def test_bytes_constants_and_syntax_are_one_line():
    assert parse_json(b'{"a": [1, 2]}', "w") == {"a": [1, 2]}
    with pytest.raises(JSONError, match=r"^w: not UTF-8 text"):
        parse_json(b'{"a": "\xff"}', "w")
    with pytest.raises(JSONError, match="^w: NaN is not JSON"):
        parse_json('{"a": NaN}', "w", constants=False)
    with pytest.raises(JSONError, match=r"^w: Expecting value: line 1 column 7 \(char 6\)$") as err:
        parse_json('{"a": }', "w")
    assert err.value.msg == "Expecting value" and err.value.pos == 6


# ---- the files it reads --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("text, says", BOMBS)
def test_a_bomb_in_grid_json_a_cell_file_or_a_speed_record_is_one_line(tmp_path, text, says):
    for name, read in (
        ("grid.json", lambda p: read_record(p, GRID)),
        ("cells/a.json", CellFile.read),
        ("a.speed.json", lambda p: read_record(p, SPEED_RECORD)),
        ("timing.json", lambda p: read_user_json(p, "timing file")),
    ):
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        with pytest.raises(UserError) as err:
            read(path)
        assert says in one_line(err.value, path)


@pytest.mark.parametrize("text, says", BOMBS)
def test_a_bomb_in_a_jsonl_file_names_its_line(tmp_path, text, says):
    path = tmp_path / "a.jsonl"
    path.write_text('{"id": "e0"}\n' + text + "\n")
    with pytest.raises(UserError) as err:
        read_jsonl(path)
    assert f"{path} line 2 is not valid JSON: {says}" in one_line(err.value, path)


@pytest.mark.parametrize("text, says", BOMBS)
def test_a_bomb_in_a_journal_line_is_set_aside_in_one_line(tmp_path, capsys, text, says):
    path = tmp_path / "j.jsonl"
    good = json.dumps({"id": "e0", "output": "x"})
    path.write_text(good + "\n" + text + "\n")
    kept = Journal(path, ["e0", "e1"], lambda row: None).recover()
    assert list(kept) == ["e0"] and path.read_text() == good + "\n"
    warnings = capsys.readouterr().err.strip().splitlines()
    assert len(warnings) == 1 and warnings[0].startswith(f"warning: {path} line 2:") and says in warnings[0]
    rejected = [json.loads(line) for line in Path(f"{path}.rejected").read_text().splitlines()]
    assert [r["line"] for r in rejected] == [2] and rejected[0]["raw"] == text


@pytest.mark.parametrize("text, says", BOMBS)
def test_a_bomb_in_an_inline_json_argument_is_one_line(text, says):
    from pipeline.cli.commands import inline_json

    with pytest.raises(UserError) as err:
        inline_json(text, "--method-args")
    assert says in one_line(err.value, "--method-args")


@pytest.mark.parametrize("text, says", BOMBS)
def test_a_bomb_in_a_vllm_workers_reply_stops_it_in_one_line(text, says):
    import queue
    import subprocess

    from pipeline.vllm.engine import VLLMError, Worker

    worker = Worker.__new__(Worker)  # its reading only: no environment, no process
    worker.settings, worker._lines = {"model": "m"}, queue.Queue()
    worker.proc = subprocess.Popen(["sleep", "30"])
    worker._lines.put(text + "\n")
    with pytest.raises(VLLMError) as err:
        worker._read(5, "a generation")
    assert "answered" in one_line(err.value, "vLLM's worker for m") and worker.proc.returncode is not None


# ---- tensors: never a pickle ---------------------------------------------------------------------------------------


class Planted:
    """A pickle's payload: unpickling it would write a file (it must never run)."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (Path.write_text, (self.marker, "ran"))


def test_a_pickle_where_tensors_are_read_is_refused_unread(tmp_path):
    import torch

    from pipeline.vllm.eagle import _names

    marker, weights = tmp_path / "ran", tmp_path / "pytorch_model.bin"
    weights.write_bytes(pickle.dumps({"fc.weight": Planted(marker)}, protocol=2))
    for read in (lambda: read_tensors(weights, "feature head weights"), lambda: _names(weights)):
        with pytest.raises(UserError) as err:
            read()
        assert "holds more than tensors, refused unread" in one_line(err.value, weights)
    assert not marker.exists()
    torch.save({"fc.weight": torch.ones(2)}, weights)  # tensors themselves: read
    assert _names(weights) == {"fc.weight"} and read_tensors(weights)["fc.weight"].tolist() == [1.0, 1.0]


# ---- links: a result is read as itself -----------------------------------------------------------------------------


def outside_and_results(tmp_path: Path, content: str) -> tuple[Path, Path]:
    outside = tmp_path / "private" / "secret.txt"
    outside.parent.mkdir()
    outside.write_text(content)
    results = tmp_path / "results"
    (results / "cells").mkdir(parents=True)
    return outside, results


def everything_under(root: Path) -> str:
    return "".join(p.read_text(errors="replace") for p in root.rglob("*") if p.is_file() and not p.is_symlink())


def test_a_journal_linked_out_of_the_results_is_refused_and_nothing_is_copied(tmp_path):
    secret = "SECRET-LINE not json, would be set aside with its text\n"
    outside, results = outside_and_results(tmp_path, json.dumps({"id": "e0", "output": "x"}) + "\n" + secret)
    journal = results / "a.journal.jsonl"
    journal.symlink_to(outside)
    with pytest.raises(UserError) as err:
        Journal(journal, ["e0"], lambda row: None).recover()
    assert "is a symbolic link; links are not followed" in one_line(err.value, journal)
    assert "SECRET-LINE" not in everything_under(results) and not Path(f"{journal}.rejected").exists()
    assert journal.is_symlink() and outside.read_text().endswith(secret)  # neither replaced nor changed


def test_a_cell_file_or_grid_json_linked_out_of_the_results_is_refused(tmp_path):
    outside, results = outside_and_results(tmp_path, '{"cell": {}, "dims": {"id": "SECRET"}}')
    for link, read in (
        (results / "cells" / "a.json", CellFile.read),
        (results / "grid.json", lambda p: read_record(p, GRID)),
        (results / "a.speed.json", lambda p: read_record(p, SPEED_RECORD)),
        (results / "a.jsonl", lambda p: read_jsonl(p, "samples file", links=False)),
    ):
        link.symlink_to(outside)
        with pytest.raises(UserError) as err:
            read(link)
        text = one_line(err.value, link)
        assert "is a symbolic link" in text and "SECRET" not in text


def test_a_models_files_are_followed_through_links(tmp_path):
    """A Hugging Face cache is made of links: a model's config.json is read through one."""
    blob = tmp_path / "blobs" / "abc"
    blob.parent.mkdir()
    blob.write_text("[3, 1, 2]")
    snapshot = tmp_path / "snapshots" / "rev"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").symlink_to(blob)
    (snapshot / "head_tokens.json").symlink_to(blob)
    assert read_record(snapshot / "head_tokens.json", "head_tokens.json") == [3, 1, 2]
    assert read_user_json(snapshot / "config.json", "model config") == [3, 1, 2]
