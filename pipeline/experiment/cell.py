"""A grid cell as types, each with one JSON form (``to_json`` / ``from_json``): ``Cell``, its ``Dims`` and the
``CellFile`` that holds both. A new cell setting is a field of ``Cell`` (and, when it is swept, a line of
``grid.py``); nothing else reads a cell by its keys.
"""

from __future__ import annotations

import json
from dataclasses import MISSING, asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from ..decoding.checks import check_gamma_schedule, check_sampling, check_seed
from ..decoding.spec import MethodSpec, parse_method
from ..decoding.tree.loop import parse_tree
from ..decoding.tree.shape import tree_problem
from ..errors import UserError
from ..files import read_user_json, write_atomic
from ..measure.speed import Policy
from ..models import ModelSpec
from ..models.spec import stored_spec
from ..records import ID, register, schema_of

CONFIG = {"config": True}  # a setting that is the config's key of the same name (a grid's, where it sets one)
SAMPLING = ("gamma", "gamma_schedule", "max_new_tokens", "temperature", "top_k", "top_p")  # passed to every run


@dataclass
class Cell:
    """What ``pipeline generate`` runs; the fields in the order of the JSON form."""

    models: list[ModelSpec]
    method: str
    task: str
    gamma: Any = 1
    method_args: dict[str, Any] = field(default_factory=dict)
    size: str | int = "tiny"
    chat: bool = False
    data_dir: str | None = field(default=None, metadata=CONFIG)
    max_new_tokens: int = field(default=128, metadata=CONFIG)
    temperature: float = 0.0
    top_k: int = field(default=0, metadata=CONFIG)
    top_p: float = field(default=1.0, metadata=CONFIG)
    seed: int = field(default=0, metadata=CONFIG)
    gamma_schedule: str = "fixed"
    baseline: str | None = None  # a method run beside each sample, e.g. "we" for "we_se"
    baseline_args: dict[str, Any] = field(default_factory=dict)
    tree: Any = None  # a token tree per round (decoding/tree/), None: a chain
    timing: dict[str, Any] = field(default_factory=dict)  # speed.Policy: how samples are timed and judged

    def __post_init__(self):  # the decoder's own checks, before anything loads
        check_args("method_args", self.method_args)
        check_args("baseline_args", self.baseline_args)
        specs = [parse_method(m) for m in (self.method, self.baseline) if m is not None]
        check_sampling(self.temperature, self.top_k, self.top_p, self.max_new_tokens)
        check_gamma_schedule(self.gamma_schedule)
        if parse_tree(self.tree) is not None and (why := tree_problem(specs[0])):
            raise UserError(f"tree={self.tree!r}: {why}")
        for spec in specs:
            spec.check_temperature(self.temperature)
        check_seed(self.seed)
        self.policy = Policy.from_dict(self.timing)

    def described(self) -> dict[str, Any]:
        """The cell as a generation job's meta file records it: every setting, the models by name."""
        settings = {k: v for k, v in self.__dict__.items() if k not in ("models", "policy")}
        return {**settings, "models": [m.name for m in self.models]}

    def sampling(self) -> dict[str, Any]:
        """The settings every run of the cell passes to ``generate`` (its method's and its baseline's)."""
        return {k: getattr(self, k) for k in SAMPLING}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Cell:
        """A cell from its JSON form; ``models`` holds names or ``{name, source, dtype, device, ...}`` objects."""
        data = dict(data)
        models = [ModelSpec(m) if isinstance(m, str) else ModelSpec(**stored_spec(m)) for m in data.pop("models", [])]
        if not models:
            raise UserError("a cell needs at least one model")
        if unknown := sorted(set(data) - set(cls.__dataclass_fields__)):
            raise UserError(f"unknown cell keys {unknown}; accepted: {', '.join(sorted(cls.__dataclass_fields__))}")
        return cls(models=models, **data)

    def to_json(self) -> dict[str, Any]:
        """The JSON form, less the settings ``unset`` marks as not set (fixed cells keep the form they had before
        schedules existed; the workflow passes ``timing`` apart, in timing.json)."""
        unset = {"gamma_schedule": self.gamma_schedule == "fixed", "baseline": self.baseline is None}
        unset |= {"baseline_args": self.baseline is None, "tree": self.tree is None, "timing": not self.timing}
        data = {f.name: getattr(self, f.name) for f in fields(self) if not unset.get(f.name)}
        return {**data, "models": [model_json(m) for m in self.models]}


def check_args(key: str, value: Any) -> None:
    """A method's arguments, as a cell holds them: an object of named values (``{"lambda": 0.5}``), one line
    naming the value otherwise (a list or a number names no argument)."""
    if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
        shown = json.dumps(value, default=str)[:60]
        raise UserError(
            f'{key}={shown} is not accepted; expected an object of named arguments, such as {{"lambda": 0.5}}'
        )


def model_json(spec: ModelSpec) -> dict[str, Any]:
    """A model as a cell names it: its name and each setting that differs from the default."""
    return {"name": spec.name} | {
        f.name: getattr(spec, f.name) for f in fields(spec)[1:] if getattr(spec, f.name) != f.default
    }


@dataclass
class Dims:
    """A cell's dimensions: the tables' columns and its W&B run's config."""

    id: str
    experiment: str
    grid: str
    model_set: str
    models: list[str]  # the config's model names
    large_model: str | None  # the set's first model (None for small_model)
    method: str
    family: str  # the method's base ensemble, or "single"
    kind: str  # MethodSpec.kind
    dataset: str
    temperature: float
    gamma: str | None = None  # as the tables show it ("3", "1-4", "2dyn", "3 t3x2x1 (15 nodes)")
    gamma_schedule: str | None = None
    tree: str | None = None
    tree_nodes: int | None = None
    baseline: str | None = None
    standard: str | None = None  # the standard method its speed is compared with
    control: str | None = None  # "null": the method timed side by side against itself (grid.null_cell)
    samples_from: str | None = None  # the cell whose side-by-side runs of this cell's method are its samples

    @property
    def spec(self) -> MethodSpec:
        return parse_method(self.method)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Dims:
        if unknown := sorted(set(data) - set(cls.__dataclass_fields__)):
            raise UserError(f"unknown dims {unknown}; accepted: {', '.join(cls.__dataclass_fields__)}")
        required = [f.name for f in fields(cls) if f.default is MISSING]
        if missing := [k for k in required if k not in data]:
            raise UserError(
                f"dims {data.get('id', '?')!r} lack {', '.join(missing)}; a cell's dims need {', '.join(required)}"
            )
        return cls(**data)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class CellFile:
    """``results/cells/<cell>.json``: the cell (what its jobs run) and its dims (None in a hand-written one)."""

    cell: Cell
    dims: Dims | None = None

    @classmethod
    def from_json(cls, data: Any, where: str = "cell file") -> CellFile:
        shape_ok = isinstance(data, dict) and isinstance(data.get("cell"), dict)
        if not shape_ok or not isinstance(data.get("dims"), dict | None):
            raise UserError(f'{where}: expected an object {{"cell": {{...}}, "dims": {{...}}}}')
        try:
            dims = Dims.from_json(data["dims"]) if data.get("dims") else None
            return cls(Cell.from_json(data["cell"]), dims)
        except TypeError as err:  # a missing key or a model's unknown one
            raise UserError(f"{where}: {err}") from None

    def to_json(self) -> dict[str, Any]:
        return {"cell": self.cell.to_json(), "dims": self.dims.to_json() if self.dims else None}

    @classmethod
    def read(cls, path: Path | str, timing_file: Path | str | None = None) -> CellFile:
        """A cell file; with ``timing_file`` (the config's ``timing`` section), its cell timed and judged by it."""
        data = read_user_json(Path(path), "cell file", links=False)  # a result: never through a link
        if timing_file and isinstance(data, dict) and isinstance(data.get("cell"), dict):
            timing = read_user_json(Path(timing_file), "timing file", links=False)
            data = {**data, "cell": {**data["cell"], "timing": timing}}
        return cls.from_json(data, f"cell file {path}")

    def write(self, path: Path | str) -> None:
        """Written atomically, keys sorted: a cell whose settings are unchanged keeps its bytes."""
        write_atomic(Path(path), json.dumps(self.to_json(), indent=1, sort_keys=True) + "\n")


GRID, CELL_FILE = "grid.json", "cell file"  # record types (``records.py``): their readers name them from here


def _register_records() -> None:
    """grid.json (each cell's dimensions) and the cell file as record types (``records.py``)."""
    dims = schema_of(Dims)
    dims["properties"]["id"] = ID  # a cell's id names its files
    register(GRID, {"type": "array", "items": dims})
    register(  # a cell file (cells/<id>.json): its settings and dimensions (``CellFile`` checks the settings' values)
        CELL_FILE,
        {
            "type": "object",
            "required": ["cell"],
            "properties": {"cell": {"type": "object"}, "dims": {"anyOf": [dims, {"type": "null"}]}},
        },
    )


_register_records()
