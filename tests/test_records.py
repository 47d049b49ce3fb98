"""Every record type the project reads back (``pipeline/records.py``) under Hypothesis: any JSON value, any bytes,
a link, a pipe or a directory in the file's place is the record, checked against its schema, or one line naming
the file; never a traceback, never a wait. And what the project itself writes is accepted."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline.errors import UserError
from pipeline.experiment.cell import CELL_FILE, GRID, CellFile
from pipeline.measure.speed import SPEED_RECORD, summarize
from pipeline.records import read_record, record_problems, records

from .conftest import cell_entry

KINDS = sorted(records())
JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)


def test_the_registry_holds_every_record_type_the_readers_name():
    assert {GRID, CELL_FILE, SPEED_RECORD} <= set(KINDS)
    assert {"meta", "sample", "score summary", "draft.json", "model record", "likelihood record", "env.json"} <= set(
        KINDS
    )
    assert {"config.json", "tokenizer_config.json", "head_tokens.json"} <= set(KINDS)


def one_line_or_record(path: Path, kind: str) -> None:
    """Read ``path`` as ``kind``: the value its schema accepts, or one line naming the file."""
    try:
        value = read_record(path, kind)
    except UserError as err:
        said = str(err)
        assert "\n" not in said and str(path) in said, said
        return
    assert record_problems(kind, value, "x") == []


def fields_of(kind: str) -> st.SearchStrategy:
    """Objects of the schema's own keys with any values: the near misses (a field of another type)."""
    schema = records()[kind]
    keys = sorted((schema.get("properties") or schema.get("items", {}).get("properties") or {"id": 0}).keys())
    obj = st.dictionaries(st.sampled_from(keys), JSON, max_size=len(keys))
    return st.one_of(obj, st.lists(obj, max_size=3), JSON)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
@pytest.mark.parametrize("kind", KINDS)
def test_any_json_in_any_record_is_the_record_or_one_line(kind, data, tmp_path):
    value = data.draw(fields_of(kind))
    path = tmp_path / "record.json"
    path.write_text(json.dumps(value))
    one_line_or_record(path, kind)


@pytest.mark.parametrize("key", ["\n", "a\rb", "\x1b[2J"], ids=["newline", "return", "escape"])
def test_a_key_holding_a_control_character_is_named_escaped_on_one_line(key, tmp_path):
    """Found by the search above: a record ``{"scores": {"\n": null}}`` was named with a newline in its line."""
    path = tmp_path / "record.json"
    path.write_text(json.dumps({"scores": {key: None}}))
    with pytest.raises(UserError) as err:
        read_record(path, "likelihood record")
    assert (
        "\n" not in str(err.value) and "\r" not in str(err.value) and f"scores.{json.dumps(key)}=null" in str(err.value)
    )


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(raw=st.binary(max_size=64))
@pytest.mark.parametrize("kind", KINDS)
def test_any_bytes_in_any_record_are_one_line(kind, raw, tmp_path):
    path = tmp_path / "record.json"
    path.write_bytes(raw)
    one_line_or_record(path, kind)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("what", ["a pipe", "a directory", "a link to a device", "a dangling link", "absent"])
def test_a_pipe_a_directory_or_a_link_in_a_records_place_is_one_line_without_a_wait(kind, what, tmp_path):
    path = tmp_path / "record.json"
    if what == "a pipe":
        os.mkfifo(path)  # no writer: a blocking open would wait forever
    elif what == "a directory":
        path.mkdir()
    elif what == "a link to a device":
        path.symlink_to("/dev/zero")  # read whole, it never ends
    elif what == "a dangling link":
        path.symlink_to(tmp_path / "nowhere")
    with pytest.raises(UserError) as err:
        read_record(path, kind)
    assert "\n" not in str(err.value) and str(path) in str(err.value)


def test_what_the_project_writes_is_accepted_and_near_misses_are_named(tmp_path):
    cell = cell_entry("humaneval/pair/sd-T0-g2")

    def row(i, tokens, wall, base_wall):  # a sample of a cell timed beside its baseline, as generation writes it
        model = {"forward_calls": tokens, "forward_time_s": wall / 2, "proposed": 4, "verified": 4, "accepted": 2}
        stats = {"new_tokens": tokens, "wall_time_s": wall, "forward_time_s": wall / 2, "models": [model]}
        return {"id": str(i), "output": "x", "stats": stats, "baseline": {"stats": {**stats, "wall_time_s": base_wall}}}

    rows = [row(i, 10, 1.0 + i / 10, 2.0) for i in range(4)]
    written = {
        GRID: [cell.dims.to_json()],
        CELL_FILE: cell.to_json(),
        SPEED_RECORD: summarize(rows).to_json(),
        "meta": {"environment": {"python": "3.11"}, "cell": cell.cell.described()},
    }
    for kind, value in written.items():
        (tmp_path / "r.json").write_text(json.dumps(value))
        assert read_record(tmp_path / "r.json", kind) == value, kind
    misses = {
        GRID: ([{**cell.dims.to_json(), "id": "../../etc"}], '0.id="../../etc" is not accepted (a path relative'),
        SPEED_RECORD: ({**summarize(rows).to_json(), "tau": "fast"}, 'tau="fast" is not accepted'),
        "head_tokens.json": ([1, -2], "1=-2 is not accepted"),
        "env.json": ({"build": "cpu"}, "'python' is a required property"),
    }
    for kind, (value, said) in misses.items():
        (tmp_path / "r.json").write_text(json.dumps(value))
        with pytest.raises(UserError, match=None) as err:
            read_record(tmp_path / "r.json", kind)
        assert said in str(err.value) and str(tmp_path / "r.json") in str(err.value), str(err.value)


def test_a_cell_file_the_workflow_writes_reads_back_through_its_type(tmp_path):
    entry = cell_entry("humaneval/pair/we-T0")
    entry.write(tmp_path / "c.json")
    assert CellFile.read(tmp_path / "c.json").to_json() == read_record(tmp_path / "c.json", CELL_FILE)
