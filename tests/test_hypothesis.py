"""Property-based tests of two public surfaces: the config check and the decoder's ``generate`` (the journal
reader's are in test_journal.py). Every outcome is a result or one ``UserError`` line, never another exception.
Derandomised and without an example database, so every run (and CI) tries the same examples."""

from __future__ import annotations

import copy
import json
import math
import tempfile
from pathlib import Path

import torch
import yaml
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from pipeline.decoding import generate
from pipeline.decoding.spec import method_names, parse_method
from pipeline.errors import ArgumentError, UserError
from pipeline.experiment.config import check_config, load_schema
from pipeline.experiment.config_file import load_config_file
from pipeline.experiment.grid import expand_cells

from .conftest import perturbed, tiny_llama

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_BYTES = (ROOT / "config" / "default.yaml").read_bytes()
DEFAULT = yaml.safe_load(DEFAULT_BYTES)
SCHEMA = load_schema()
TRIED = settings(derandomize=True, database=None, deadline=None, suppress_health_check=list(HealthCheck))


def one_line(err: BaseException) -> bool:
    """A clear error: a UserError of one non-empty line (counted by its type in the statistics)."""
    event(f"clear error: {type(err).__name__}")
    return isinstance(err, UserError) and str(err).strip() != "" and "\n" not in str(err)


# ---- the config check -------------------------------------------------------------------------------------

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-3, 200),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from(["we", "we_se", "sd", "humaneval", "smollm2-135m-instruct", "", "x" * 40, "lambda", "0.5"]),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.sampled_from(["a", "lambda", "size"]), inner, max_size=2)
    ),
    max_leaves=6,
)
TOP = [
    "results",
    "data_dir",
    "models",
    "grids",
    "datasets",
    "gamma",
    "temperature",
    "max_new_tokens",
    "seed",
    "se_large_gamma",
    "proposer",
    "side_by_side",
    "threads",
    "top_k",
    "top_p",
    "method_args",
    "colour",
]
IN_GRID = ["name", "model_sets", "methods", "temperature", "gamma", "method_args", "datasets", "max_new_tokens"]
PLAUSIBLE = {  # values the schema accepts (or nearly), so that many generated configs are valid
    "gamma": [[1], [1, 2], [3]],
    "temperature": [[0.0], [1.0], [0.0, 0.7]],
    "max_new_tokens": [8, 64, 0],
    "seed": [0, 7],
    "top_k": [0, 5],
    "top_p": [0.9, 1.0],
    "threads": [1, 2],
    "side_by_side": [True, False],
    "proposer": ["draft", "lookup"],
    "se_large_gamma": [None, 2],
    "methods": [["we", "sd"], ["large_model"], ["cd_se"], ["we_me"]],
    "method_args": [{"lambda": 0.3}, {"alpha": 0.2}, {}],
    "datasets": [{"humaneval": {"size": 3}}, {"humaneval": {"size": "tiny", "chat": False}}],
    "name": ["other", "we"],
}


def edit(where):
    keys = TOP if where == "top" else IN_GRID
    return st.sampled_from(keys).flatmap(
        lambda key: st.tuples(st.just(where), st.just(key), st.sampled_from(PLAUSIBLE.get(key, [None])) | values)
    )


changes = st.lists(st.one_of(edit("top"), st.integers(0, 3).flatmap(edit)), max_size=3)


def changed(config: dict, edits) -> dict:
    config = copy.deepcopy(config)
    for where, key, value in edits:
        if where == "top":
            config[key] = value
        elif isinstance(config["grids"], list) and config["grids"]:  # a grid's key (while grids is a list)
            grid = config["grids"][where % len(config["grids"])]
            if isinstance(grid, dict):
                grid[key] = value
    return config


@settings(TRIED, max_examples=300)
@given(changes)
def test_every_config_is_a_cell_list_or_one_line(edits):
    config = changed(DEFAULT, edits)
    try:
        cells = expand_cells(check_config(config, SCHEMA))
    except UserError as err:
        assert one_line(err), repr(err)
        return
    event("handled: a cell list")
    assert cells and all(isinstance(k, str) and isinstance(v.cell.to_json(), dict) for k, v in cells.items())


@settings(TRIED, max_examples=100)
@given(
    st.binary(max_size=200)
    | st.text(max_size=200).map(str.encode)
    | st.tuples(st.integers(0, len(DEFAULT_BYTES)), st.binary(min_size=1, max_size=3)).map(
        lambda at: DEFAULT_BYTES[: at[0]] + at[1] + DEFAULT_BYTES[at[0] :]  # the default, a few bytes put in
    )
    | st.just(DEFAULT_BYTES)
)
def test_every_config_file_is_read_or_named_in_one_line(data):
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "config.yaml"
        path.write_bytes(data)
        try:
            expand_cells(check_config(load_config_file(path), SCHEMA))
        except UserError as err:
            assert one_line(err), repr(err)
            return
        event("handled: a cell list")


# ---- the decoder --------------------------------------------------------------------------------------------

VOCAB = 32
_TARGET = tiny_llama(0)
MODELS = [_TARGET, perturbed(_TARGET, 0.05, seed=1)]
BUILT_IN = {None, "we", "cd", "gac"}  # ensembles of the package, not those other test modules register
METHODS = sorted(m for m in method_names() if getattr(parse_method(m).ensemble, "name", None) in BUILT_IN)

ints = st.integers(-2, 40)
token = st.integers(0, VOCAB - 1)
VALID = {  # arguments generate accepts (for most methods)
    "prompt_ids": st.lists(token, min_size=1, max_size=6),
    "method": st.sampled_from(METHODS),
    "gamma": st.integers(1, 3) | st.lists(st.integers(1, 3), min_size=2, max_size=2),
    "max_new_tokens": st.integers(0, 6),
    "temperature": st.sampled_from([0.0, 1.0]) | st.floats(0.1, 2),
    "top_k": st.integers(0, 40),
    "top_p": st.floats(0.05, 1),
    "seed": st.integers(0, 2**64 - 1),
    "eos_token_id": st.none() | token,
    "method_args": st.sampled_from(
        [None, {"lambda": 0.3}, {"alpha": 0.2}, {"weights": [1, 3]}, {"proposer": "lookup"}]
    ),
}
BROKEN = {  # and values of every kind, most of them refused
    "prompt_ids": st.lists(ints, max_size=6) | st.just("abc") | st.just(torch.zeros(2, 2, dtype=torch.long)),
    "method": st.sampled_from(["nope", "we_sd_se", "", "we_p_se"]),
    "gamma": st.integers(-1, 0) | st.lists(st.integers(0, 3), max_size=3) | st.floats(0, 3) | st.none(),
    "max_new_tokens": st.integers(-1, 300) | st.floats(0, 6),
    "temperature": st.floats(-1, 0) | st.sampled_from([math.nan, math.inf]),
    "top_k": st.integers(-1, 0) | st.floats(0, 3),
    "top_p": st.floats(-0.5, 0) | st.floats(1, 1.5) | st.just(math.nan),
    "seed": st.integers(-(2**8), -1) | st.integers(2**64, 2**65),
    "eos_token_id": ints | st.lists(ints, max_size=3) | st.just("eos"),
    "method_args": st.dictionaries(
        st.sampled_from(["lambda", "weights", "alpha", "beta", "threshold", "first_proposer", "proposer", "x"]),
        st.floats(-1, 2) | st.integers(-1, 3) | st.lists(st.floats(-1, 2), max_size=3) | st.just("lookup"),
        max_size=3,
    )
    | st.just([1]),
}


@st.composite
def arguments(draw):
    """Valid arguments with none, one or two of them replaced by a value of any kind."""
    kwargs = draw(st.fixed_dictionaries(VALID))
    for key in draw(st.lists(st.sampled_from(sorted(BROKEN)), max_size=2, unique=True)):
        kwargs[key] = draw(BROKEN[key])
    return kwargs


@settings(TRIED, max_examples=300)
@given(arguments())
def test_every_generate_call_is_a_result_or_one_argument_error(kwargs):
    try:
        out = generate(MODELS, **kwargs)
    except ArgumentError as err:
        assert one_line(err), repr(err)
        return
    event("handled: a result")
    assert all(isinstance(t, int) and 0 <= t < VOCAB for t in out.token_ids)
    assert len(out.token_ids) <= kwargs["max_new_tokens"]
    if kwargs["eos_token_id"] in out.token_ids:
        assert out.token_ids.index(kwargs["eos_token_id"]) == len(out.token_ids) - 1  # it stops on EOS
    stats = json.loads(json.dumps(out.stats.__dict__, default=lambda o: o.__dict__))
    assert "NaN" not in json.dumps(stats), stats
