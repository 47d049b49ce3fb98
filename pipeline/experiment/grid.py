"""The workflow's grid: a checked config (``config.py``) expanded into cells (``cell.CellFile``), each a ``Cell``
(what ``pipeline generate`` runs) and its ``Dims`` (the tables' columns). Which cells are made, and which are left
out as not applying: docs/workflow.md, "Cells and rules".
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import fields
from typing import Any

from ..decoding.joined import one_tokenizer_problem
from ..decoding.spec import MethodSpec, parse_method
from ..decoding.tree.shape import mixed_tokenizers_problem
from ..models import ModelSpec
from .cell import CONFIG, Cell, CellFile, Dims
from .config import ConfigError, model_entry
from .preflight import mixed_tokenizers, own_tokenizer

# what a grid may set for itself (and the Cell settings marked CONFIG), else the config's top-level value
GRID_KEYS = "datasets gamma gamma_schedule temperature method_args proposer se_large_gamma tree".split()


def expand_cells(config: dict[str, Any]) -> dict[str, CellFile]:
    """Every cell of a checked config, by cell id."""
    cells: dict[str, CellFile] = {}
    for grid in config["grids"]:
        g = {k: grid.get(k, config[k]) for k in GRID_KEYS}
        settings = {f.name: grid.get(f.name, config[f.name]) for f in fields(Cell) if f.metadata == CONFIG}
        for (set_name, members), method in itertools.product(grid["model_sets"].items(), grid["methods"]):
            spec = parse_method(method)
            if not spec.fits(len(members), g["proposer"]):
                continue
            for entry in _cells(config, grid["name"], g, settings, set_name, members, spec):
                if entry.dims.id in cells and cells[entry.dims.id].cell != entry.cell:
                    raise ConfigError(
                        f"cell {entry.dims.id} is defined twice with different settings (grids "
                        f"{cells[entry.dims.id].dims.grid!r} and {grid['name']!r}); give one set another name or "
                        "align the settings"
                    )
                cells.setdefault(entry.dims.id, entry)
    if not cells:
        raise ConfigError("the config expands to no cells: check that each grid's methods fit its model sets")
    if config["timing"].get("null", True):
        control = null_cell(config)
        cells[control.dims.id] = control
    for cell_id, source in derived_cells(cells).items():
        cells[cell_id].dims.samples_from = source
    return cells


# the settings in which a cell and the side-by-side runs of its method in another cell may differ: the rest (models,
# task, prompts, seed, sampling) must be equal for the runs to be the ones the cell's own job would make
OWN_SETTINGS = {"method", "method_args", "gamma", "gamma_schedule", "baseline", "baseline_args", "tree", "timing"}


def derived_cells(cells: dict[str, CellFile]) -> dict[str, str]:
    """The standard-method cells whose samples another cell already makes, by cell id -> that cell's id (its
    ``samples_from``): a cell that runs nothing beside it, and the first cell of the config (not a parallel one,
    whose job runs more threads) whose side-by-side baseline is the same method with the same arguments on the
    same models, prompts, seed and sampling (``job/derive.py``; docs/workflow.md, "Cells and rules"). The null
    cell is never one: its pairs are its point."""

    def shared(c: Cell) -> dict[str, Any]:
        return {f.name: getattr(c, f.name) for f in fields(c) if f.name not in OWN_SETTINGS}

    def runs_beside(source: CellFile, c: Cell) -> bool:
        s = source.cell
        same = s.baseline == c.method and s.baseline_args == c.method_args
        # a parallel cell's job runs a thread per model (generate_threads): its baseline runs are not timed as
        # the cell's own job would time them
        return same and not source.dims.control and not source.dims.spec.parallel and shared(s) == shared(c)

    out = {}
    for cell_id, entry in cells.items():
        if entry.cell.baseline is None and not entry.dims.control:
            source = next((i for i, other in cells.items() if runs_beside(other, entry.cell)), None)
            if source is not None:
                out[cell_id] = source
    return out


def null_cell(config: dict[str, Any]) -> CellFile:
    """The run's own control (``timing.null``): the first grid's large model timed side by side against itself,
    on its first model set, dataset and temperature, interleaved as every pair is. No effect to find: its speed-up
    should be 1.00x with an interval covering 1, and unflagged on a quiet machine (docs/speed.md, "The null
    cell")."""
    grid = config["grids"][0]
    g = {k: grid.get(k, config[k]) for k in GRID_KEYS}
    settings = {f.name: grid.get(f.name, config[f.name]) for f in fields(Cell) if f.metadata == CONFIG}
    name = next(iter(grid["model_sets"].values()))[0]
    dataset, dopts = next(iter(g["datasets"].items()))
    spec = parse_method("large_model")
    cell = Cell(
        [ModelSpec(**model_entry(config, name))],
        spec.name,
        dataset,
        1,
        {},
        dopts.get("size", "tiny"),
        bool(dopts.get("chat", False)),
        temperature=float(g["temperature"][0]),
        baseline=spec.name,
        **settings,
    )
    dims = _dims(config, grid["name"], name, [name], spec, cell, None)
    dims.id, dims.standard, dims.control = f"{dims.id}-null", spec.name, "null"
    return CellFile(cell, dims)


def _cells(config, grid: str, g: dict, settings: dict, set_name: str, members, spec: MethodSpec) -> Iterator[CellFile]:
    """The cells of one method on one model set of a grid (``settings``: Cell's CONFIG ones), its arguments
    checked first."""
    alone = {"large_model": members[:1], "small_model": members[-1:]}.get(spec.name)  # one model of the set
    names, label = (alone, alone[0]) if alone else (list(members), set_name)
    where = f"grid {grid!r}, set {set_name!r}"
    gammas = _gammas(g["gamma"], spec, len(names), grid) if spec.speculative else [None]
    if not gammas:
        raise ConfigError(
            f"config key gamma: {g['gamma']} has no integer for {spec.name!r} (grid {grid!r}); "
            "per-model lists apply to *_se methods only"
        )
    args = {k: v for k, v in g["method_args"].items() if k in spec.accepted_args()}
    if "proposer" in spec.accepted_args():  # not the peers (transformers' own methods)
        args.setdefault("proposer", g["proposer"])
    mixed = mixed_tokenizers(config["models"], names)
    if mixed and (why := one_tokenizer_problem(spec)):
        raise ConfigError(
            f"{where}: {spec.name!r} needs one shared tokenizer but {', '.join(map(repr, names))} tokenize "
            f"differently ({why}); the other methods run over the union of their vocabularies"
        )
    restricted = [repr(m) for m in names if _restricted_head(config["models"][m])]
    try:  # the decoder's own check of the method and its arguments, before any job starts
        spec.check(len(names), args, restricted)
    except ValueError as err:
        raise ConfigError(f"{where}: {err}") from None
    baseline = spec.baseline if config["side_by_side"] else None  # it speeds up its base: run the base beside it
    baseline_args = {k: v for k, v in args.items() if k in parse_method(baseline).accepted_args()} if baseline else {}
    schedules = g["gamma_schedule"] if spec.own_loop else ["fixed"]
    trees = _trees(g["tree"], spec, grid)
    if any(trees) and mixed:
        raise ConfigError(f"{where}: config key tree: {g['tree']} with {mixed_tokenizers_problem(names)}")
    for dataset, dopts in g["datasets"].items():
        for t in g["temperature"]:
            try:
                spec.check_temperature(float(t))
            except ValueError as err:
                raise ConfigError(f"grid {grid!r}: {err}") from None
            for gamma, schedule, tree in itertools.product(gammas, schedules, trees):
                cell = Cell(
                    [ModelSpec(**model_entry(config, m)) for m in names],
                    spec.name,
                    dataset,
                    _gamma(gamma, spec, g["se_large_gamma"], len(names)),
                    dict(args),
                    dopts.get("size", "tiny"),
                    bool(dopts.get("chat", False)),
                    temperature=float(t),
                    gamma_schedule=schedule,
                    baseline=baseline,
                    baseline_args=dict(baseline_args),
                    tree=tree.label if tree else None,
                    **settings,
                )
                yield CellFile(cell, _dims(config, grid, label, names, spec, cell, tree))


def _dims(config, grid: str, label: str, names: list[str], spec: MethodSpec, cell: Cell, tree) -> Dims:
    gamma = f"-g{fmt_gamma(cell.gamma, cell.gamma_schedule)}" if spec.speculative else ""
    return Dims(
        id=f"{cell.task}/{label}/{spec.name}-T{cell.temperature:g}{gamma}" + (f"-{tree.label}" if tree else ""),
        experiment=config["experiment"],
        grid=grid,
        model_set=label,
        models=names,
        large_model=names[0] if spec.name != "small_model" else None,
        method=spec.name,
        family=spec.family,
        kind=spec.kind,
        dataset=cell.task,
        temperature=cell.temperature,
        gamma=fmt_gamma(cell.gamma, cell.gamma_schedule, tree) if spec.speculative else None,
        gamma_schedule=cell.gamma_schedule if spec.speculative else None,
        tree=tree.label if tree else None,
        tree_nodes=tree.nodes if tree else None,
        baseline=cell.baseline,
        standard=spec.standard,
    )


def fmt_gamma(g: Any, schedule: str = "fixed", tree: Any = None) -> str:
    """A gamma as cell ids and tables show it; a dynamic schedule's starting gamma is marked ``dyn``; in the
    tables a token tree follows it with its node budget (``3 t3x2x1 (15 nodes)``)."""
    text = "-".join(map(str, g)) if isinstance(g, list) else str(g)
    text = text + "dyn" if schedule == "dynamic" else text
    return f"{text} {tree.label} ({tree.nodes} nodes)" if tree is not None else text


def _gamma(gamma: Any, spec: MethodSpec, se_large_gamma: int | None, n: int) -> Any:
    """A cell's gamma: 1 for a method that does not speculate; for ``*_se`` with ``se_large_gamma``, the
    large model's own and the sweep's for the others."""
    if gamma is None:
        return 1
    if spec.in_turn and isinstance(gamma, int) and se_large_gamma is not None:
        return [se_large_gamma] + [gamma] * (n - 1)
    return gamma


def _restricted_head(model: dict[str, Any]) -> bool:
    distill = model.get("distill")
    restricted = distill is not None and not model.get("full_head") and distill.get("head_tokens") != 0
    return restricted and not own_tokenizer(model)  # a student's head is its own vocabulary's, whole


def _gammas(sweep: list[Any], spec: MethodSpec, n: int, grid: str) -> list[Any]:
    """The sweep's values that apply: per-model lists only for ``*_se`` (one entry per model), ints for all."""
    out = []
    for value in sweep:
        if isinstance(value, list):
            if not spec.in_turn:
                continue
            if len(value) != n:
                raise ConfigError(
                    f"config key gamma: {value} has {len(value)} entries but grid {grid!r} has a set of {n} "
                    "models; a per-model gamma list needs one entry per model"
                )
        out.append(value)
    return out


def _trees(sweep: list[Any], spec: MethodSpec, grid: str) -> list[Any]:
    """The grid's trees (``decoding/tree/``) for ``spec``: each checked; None (a chain) only for the methods
    that cannot take one."""
    from ..decoding.tree.loop import parse_tree
    from ..decoding.tree.shape import tree_problem

    if tree_problem(spec):
        return [None]
    try:
        return list(dict.fromkeys(parse_tree(value) for value in sweep))
    except ValueError as err:
        raise ConfigError(f"grid {grid!r}: config key {err}") from None
