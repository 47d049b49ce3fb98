"""The decoding engines: their records (``pipeline/decoding/engines.py``, the facts) and their behaviour
(``pipeline/engines/``, one module each): every engine has a behaviour of the contract's signatures, every method an
engine brings parses to that engine with the record's facts, and a record and a behaviour are all an engine needs
for its methods to exist (checked on a copy of the package with one added)."""

from __future__ import annotations

import inspect
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.decoding.engines import ENGINES, OURS, Runs
from pipeline.decoding.forms import KINDS
from pipeline.decoding.spec import method_names, parse_method
from pipeline.engines import BEHAVIOURS, behaviour
from pipeline.errors import ArgumentError

ROOT = Path(__file__).resolve().parents[1]


def test_every_engine_has_a_behaviour_and_every_behaviour_an_engine():
    assert set(BEHAVIOURS) == set(ENGINES)


@pytest.mark.parametrize("name", list(ENGINES))
def test_every_behaviour_has_the_contracts_signatures(name):
    engine, does = ENGINES[name], behaviour(ENGINES[name])
    runs = inspect.signature(does.runs)
    assert list(runs.parameters) == ["cell", "stack"] and runs.return_annotation in (Runs, "Runs")
    for hook, arity in ((does.availability, 0), (does.cannot_load, 1), (does.head_problem, 3)):
        required = [p for p in inspect.signature(hook).parameters.values() if p.default is inspect.Parameter.empty]
        assert len(required) == arity, (name, hook)
    if engine.environment:  # its environment's record is a rule's output
        rules = "\n".join(p.read_text() for p in (ROOT / "workflow" / "rules").glob("*.smk"))
        assert f'PATHS.environment(ENGINES["{name}"].environment)' in rules  # its rule's output
    assert (engine.elsewhere is None) == (engine.environment is None)  # run apart from generate: in its own env


def test_ours_asks_nothing_of_a_model_or_a_head():
    does = behaviour(OURS)
    assert does.availability() is None and does.cannot_load(["AnyForCausalLM"]) == []
    assert does.head_problem(None, "m", {}) is None


@pytest.mark.parametrize("name", list(ENGINES))
def test_every_method_an_engine_brings_parses_to_it_with_its_records_facts(name):
    engine, names = ENGINES[name], method_names()
    for method, peer in engine.methods.items():
        spec = parse_method(method)
        assert spec.engine is engine and spec.peer and spec.kind == engine.peer_kind and method in names
        assert (spec.baseline, spec.peer_proposer, spec.ours, spec.peer_corrected) == (
            peer.base,
            peer.proposer,
            peer.ours,
            peer.corrected,
        )
        assert parse_method(spec.ours).engine is OURS and spec.exact_at(0.0)
        assert spec.exact_at(1.0) == (peer.not_exact is None)
        assert set(engine.method_args) <= set(spec.accepted_args())
    if engine.standard:
        spec = parse_method(engine.standard)
        assert spec.engine is engine and spec.kind == "plain" and spec.baseline is None and engine.standard in names
        assert parse_method(engine.reference).engine is OURS
    for method in (*([engine.standard] if engine.standard else []), *engine.methods):
        if engine.elsewhere:  # our decoder refuses it in one line that says where it runs
            with pytest.raises(ArgumentError, match="^" + re.escape(f"'{method}' runs {engine.elsewhere};")):
                from pipeline.decoding.methods import plan_method

                plan_method(method, [2, 1], 1, {})


def test_ours_decodes_every_method_of_our_own():
    ours = [m for m in method_names() if parse_method(m).engine is OURS]
    assert "sd" in ours and "we_se" in ours and not any(parse_method(m).peer for m in ours)
    assert OURS.unions and OURS.restricted_heads and OURS.elsewhere is None and not OURS.methods


def test_a_row_added_to_the_table_is_all_an_engine_needs(tmp_path):
    """A copy of the package with one more record: its methods are listed, parsed to it, checked against a model
    set, refused by our decoder with its own words, and their kind is one the report counts as a peer's."""
    shutil.copytree(ROOT / "pipeline", tmp_path / "pipeline", ignore=shutil.ignore_patterns("__pycache__"))
    table = tmp_path / "pipeline" / "decoding" / "engines.py"
    text = table.read_text()
    anchor = "        )\n    }\n)\nOURS"
    assert text.count(anchor) == 1
    row = (
        '            Engine("toy", "Toy", methods={"toy_lookup": PeerMethod("large_model", "lookup", "sd")}, '
        'peer_kind="toy_peer", elsewhere="in Toy\'s own process"),\n'
    )
    table.write_text(text.replace(anchor, row + anchor))
    (tmp_path / "pipeline" / "engines" / "toy.py").write_text(  # its behaviour: one module, one line in the table
        "from .base import Behaviour\nfrom .ours import runs\nTOY = Behaviour(runs, lambda: 'no Toy here')\n"
    )
    behaviours = tmp_path / "pipeline" / "engines" / "__init__.py"
    text = behaviours.read_text()
    assert text.count('"vllm": VLLM})') == 1
    behaviours.write_text(
        text.replace("from .vllm import VLLM\n", "from .toy import TOY\nfrom .vllm import VLLM\n").replace(
            '"vllm": VLLM})', '"vllm": VLLM, "toy": TOY})'
        )
    )
    probe = (
        "from pipeline.decoding.spec import parse_method, method_names\n"
        "from pipeline.decoding.methods import plan_method\n"
        "from pipeline.report.figures import PEER_KINDS\n"
        "from pipeline.engines import behaviour\n"
        "s = parse_method('toy_lookup')\n"
        "assert 'toy_lookup' in method_names() and s.engine.name == 'toy' and s.kind in PEER_KINDS\n"
        "assert s.baseline == 'large_model' and s.check(1, {}) == {} and s.model_range() == (1, 2)\n"
        "assert behaviour(s.engine).availability() == 'no Toy here'\n"
        "try:\n    plan_method('toy_lookup', [1], 1, {})\nexcept ValueError as err:\n    print(err)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], cwd=tmp_path, capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    said = "'toy_lookup' runs in Toy's own process; this decoder runs our methods and transformers' own (hf_*)"
    assert done.stdout.strip() == said


def test_the_peer_kinds_are_the_records():
    assert {k for k, f in KINDS.items() if f.peer} == {e.peer_kind for e in ENGINES.values() if e.peer_kind}
