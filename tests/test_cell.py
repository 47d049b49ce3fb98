"""The cell as types (pipeline/experiment/cell.py): one JSON round trip over every cell of the shipped configs, the file
form, one-line refusals; and the method policy the grid reads from MethodSpec (a proposer registered in one place)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeline.decoding.methods import plan_method
from pipeline.decoding.spec import method_names, parse_method
from pipeline.errors import UserError
from pipeline.experiment.cell import Cell, CellFile, Dims
from pipeline.experiment.config import check_config
from pipeline.experiment.config_file import load_config_file
from pipeline.experiment.grid import expand_cells

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("name", ["default", "paper"])
def test_every_cell_of_a_shipped_config_makes_one_json_round_trip(name, tmp_path):
    cells = expand_cells(check_config(load_config_file(ROOT / "config" / f"{name}.yaml")))
    for cell_id, entry in cells.items():
        data = entry.to_json()
        assert data["dims"]["id"] == cell_id and list(data) == ["cell", "dims"]
        text = json.dumps(data, indent=1, sort_keys=True)  # as the workflow's rule writes it
        back = CellFile.from_json(json.loads(text))
        assert back == entry and back.to_json() == data, cell_id
        assert Cell.from_json(entry.cell.to_json()) == entry.cell and Dims.from_json(data["dims"]) == entry.dims
        # the form every cell file has had: optional keys only when set, models as the config's entries
        cell = data["cell"]
        assert ("gamma_schedule" in cell) == (entry.cell.gamma_schedule != "fixed"), cell_id
        assert ("baseline" in cell) == ("baseline_args" in cell) == (entry.cell.baseline is not None), cell_id
        assert ("tree" in cell) == (entry.cell.tree is not None) and "timing" not in cell, cell_id
        assert [m["name"] for m in cell["models"]] == data["dims"]["models"], cell_id
    first = next(iter(cells.values()))
    first.write(tmp_path / "cell.json")
    assert (tmp_path / "cell.json").read_text() == json.dumps(first.to_json(), indent=1, sort_keys=True) + "\n"
    assert CellFile.read(tmp_path / "cell.json") == first


def test_the_json_form_keeps_its_key_order_and_omissions():
    cell = Cell.from_json(
        {"models": ["a", {"name": "b", "source": "x", "full_head": True}], "method": "sd", "task": "t"}
    )
    assert list(cell.to_json()) == [
        "models", "method", "task", "gamma", "method_args", "size", "chat", "data_dir", "max_new_tokens",
        "temperature", "top_k", "top_p", "seed",
    ]  # fmt: skip
    assert cell.to_json()["models"] == [{"name": "a"}, {"name": "b", "source": "x", "full_head": True}]
    dynamic = Cell.from_json({**cell.to_json(), "gamma_schedule": "dynamic", "baseline": "large_model", "tree": "3x2"})
    assert list(dynamic.to_json())[-4:] == ["gamma_schedule", "baseline", "baseline_args", "tree"]
    assert Cell.from_json(dynamic.to_json()) == dynamic


@pytest.mark.parametrize(
    "content, message",
    [
        ('{"cell": {"models": ["a"], "method": "sd", "task": "t", "colour": 1}}', r"unknown cell keys \['colour'\]"),
        ('{"cell": {"models": ["a"], "method": "sd", "task": "t", "temperature": -1}}', "temperature=-1: expected"),
        ('{"cell": {"models": ["a"], "method": "nope", "task": "t"}}', "unknown method 'nope'"),
        ('{"cell": {"models": [], "method": "sd", "task": "t"}}', "a cell needs at least one model"),
        ('{"cell": {"models": [{"name": "a", "size": 3}], "method": "sd", "task": "t"}}', "cell file .*: .*'size'"),
        ('{"cell": {"models": ["a"], "method": "sd"}}', "cell file .*: .*'task'"),
        ('{"cell": {"models": ["a"], "method": "sd", "task": "t"}, "dims": {"id": "x", "hue": 1}}', "unknown dims"),
        ('{"cell": {"models": ["a"], "method": "sd", "task": "t"}, "dims": 3}', "expected an object"),
        ('{"cell": {"models": ["a"], "method": "sd", "task": "t"}, "dims": {"id": "x"}}', "dims 'x' lack experiment"),
        ('["cell"]', "expected an object"),
        ('{"cell": ', "cell file .*: Expecting value"),
    ],
)
def test_a_bad_cell_file_is_refused_in_one_line(content, message, tmp_path):
    path = tmp_path / "cell.json"
    path.write_text(content)
    with pytest.raises(UserError, match=message) as err:
        CellFile.read(path)
    assert "\n" not in str(err.value)


def test_a_timing_file_sets_how_the_cell_is_judged(tmp_path):
    (tmp_path / "cell.json").write_text('{"cell": {"models": ["a"], "method": "sd", "task": "t"}}')
    (tmp_path / "timing.json").write_text('{"remeasure": 5}')
    cell = CellFile.read(tmp_path / "cell.json", tmp_path / "timing.json").cell
    assert cell.policy.remeasure == 5 and cell.to_json()["timing"] == {"remeasure": 5}
    (tmp_path / "timing.json").write_text('{"remeasures": 5}')
    with pytest.raises(UserError, match=r"unknown timing settings \['remeasures'\]"):
        CellFile.read(tmp_path / "cell.json", tmp_path / "timing.json")


def test_the_method_policy_is_read_off_the_spec():
    """What the grid, the decoder and the tables ask of a method, by name of the question."""
    for name in method_names():
        spec = parse_method(name)
        assert spec.standard == (spec.baseline or (name if spec.ensemble else None))
        assert not (spec.own_loop and (spec.peer or spec.mixture or not spec.speculative)), name
        assert spec.in_turn <= spec.own_loop and spec.greedy_ok != spec.mixture, name
    assert [parse_method(m).baseline for m in ("sd", "we_se", "we_p", "we_me", "hf_assisted", "we")] == [
        "large_model", "we", "we", "we", "large_model", None,
    ]  # fmt: skip
    assert parse_method("we_se").own_loop and not parse_method("we_me_sd").own_loop
    assert parse_method("small_model").family == "single" and parse_method("cd_sd").family == "cd"


def test_a_plan_needs_parameter_counts_only():
    plan, args = plan_method("we_se", [100, 10, 50], [1, 2, 3], {})
    assert args["first_proposer"] == 1 and [turn for turn, _ in plan.schedule] == [(1,), (2,), (0,)]
    plan, _ = plan_method("cd_sd", [0, 0], 2, {})
    assert plan.members == [0, 1] and plan.schedule[0][1] == 2


class Repeat:
    """A proposer that proposes the context's last token again (one-hot): a stand-in for a new proposer kind."""

    def __init__(self):
        from pipeline.decoding.stats import ModelStats

        self.stats = ModelStats()

    def feed(self, tokens, committed):
        pass

    def draft(self, tokens, committed):
        from pipeline.decoding.proposers import Proposal

        return Proposal(tokens[-1], None, self)


def test_a_registered_proposer_is_a_proposer_kind_everywhere(trio):
    from pipeline.decoding import generate
    from pipeline.decoding.proposers import NAMED_PROPOSERS, register_proposer
    from pipeline.decoding.spec import proposer_kinds

    register_proposer("repeat")(Repeat)
    try:
        assert {"repeat", "repeat+draft"} <= set(proposer_kinds()) <= set(parse_method("we_sd").proposer_kinds)
        with pytest.raises(UserError, match="cannot register proposer 'repeat'"):
            register_proposer("repeat")(Repeat)
        prompt = [1, 2, 3, 4]
        plain = generate(list(trio[:2]), prompt, "we", max_new_tokens=12)
        drafted = generate(
            list(trio[:2]), prompt, "we_sd", gamma=3, max_new_tokens=12, method_args={"proposer": "repeat"}
        )
        assert drafted.token_ids == plain.token_ids and drafted.stats.proposers["repeat"].proposed > 0
        config = load_config_file(ROOT / "config" / "default.yaml")
        we = next(g for g in config["grids"] if g["name"] == "we")  # a grid of trees that takes the config's proposer
        config["grids"].append({**we, "name": "trees", "methods": ["we_se"], "gamma": [2], "tree": ["2x1"]})
        with pytest.raises(UserError, match=r"tree: \"2x1\" with proposer 'repeat', which drafts one candidate"):
            check_config({**config, "proposer": "repeat+draft"})  # a trees grid needs one that branches
        chains = {**config, "grids": [g for g in config["grids"] if not g.get("tree")]}
        assert check_config({**chains, "proposer": "repeat+draft"})["proposer"] == "repeat+draft"
    finally:
        NAMED_PROPOSERS.pop("repeat")
    with pytest.raises(
        UserError, match=r"config key proposer: \"repeat\" is not accepted; expected draft, a registered "
    ):
        check_config({**config, "proposer": "repeat"})
