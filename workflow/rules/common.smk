# Config loading and checking, the grid of cells, shared paths.
import json
import re
import shlex
import sys
from pathlib import Path

import yaml
from snakemake.settings.types import DeploymentMethod
from snakemake.utils import min_version, update_config

min_version("8.0")

ROOT = Path(workflow.basedir)
sys.path.insert(0, str(ROOT))  # the pipeline package, also when it is not installed

from pipeline.decoding.engines import ENGINES
from pipeline.engines import behaviour
from pipeline.experiment.config import ConfigError, check_config, load_schema, model_entry
from pipeline.experiment.config_file import load_config_file
from pipeline.experiment.grid import expand_cells
from pipeline.experiment.paths import Results
from pipeline.experiment.preflight import models_to_prepare
from pipeline.experiment.checks import check_local
from pipeline.files import parse_json, read_jsonl, read_user_json
from pipeline.job.likelihood import job_specs

try:
    for _file in workflow.overwrite_configfiles:  # Snakemake's YAML reader keeps the last of duplicate keys
        load_config_file(_file)
    if not workflow.overwrite_configfiles:  # no --configfile: the embedded default, under any --config values
        _base = load_config_file(ROOT / "config" / "default.yaml")
        update_config(_base, dict(config))
        config.clear()
        config.update(_base)
    _checked = check_config(dict(config), load_schema(ROOT / "workflow" / "schemas" / "config.schema.yaml"))
    CELLS = expand_cells(_checked)
    check_local(_checked, CELLS)
except ConfigError as err:
    sys.stderr.write(f"error: {err}\n")
    sys.exit(2)

# Cells of an engine with an environment of its own (its record, pipeline/decoding/engines.py: vLLM's, built by
# rule vllm_env from pipeline/vllm/env.py). Whether it can run here is its behaviour's to say (pipeline/engines/).
# Where an engine cannot run here, its cells are left out in one line, before any job, and every other cell runs
# as before.
ENGINE_CELLS = {c: e.dims.spec.engine for c, e in CELLS.items() if e.dims.spec.engine.environment}
for _engine in {id(e): e for e in ENGINE_CELLS.values()}.values():
    if _why := behaviour(_engine).availability():
        _out = sorted(c for c, e in ENGINE_CELLS.items() if e is _engine)
        sys.stderr.write(
            f"left out: {len(_out)} {_engine.title} cells ({', '.join(sorted({CELLS[c].dims.method for c in _out}))}"
            f"): {_engine.title}'s environment cannot be built here: {_why}\n"
        )
        CELLS = {c: e for c, e in CELLS.items() if c not in _out}
        ENGINE_CELLS = {c: e for c, e in ENGINE_CELLS.items() if c not in _out}

RESULTS = _checked["results"].rstrip("/")  # the config's; a rule takes the root from its own files (PATHS.root_of)
PATHS = Results(RESULTS)  # every file of it (pipeline/experiment/paths.py)
# How jobs run Python is a matter of deployment, not of what a job computes, so it is set for every
# shell command here and kept out of the rules' params (moving the checkout or switching to conda
# environments reruns nothing): with --software-deployment-method conda, the rule's environment
# (workflow/envs/); else this interpreter. The repository is importable either way.
_CONDA = DeploymentMethod.CONDA in workflow.deployment_settings.deployment_method
shell.prefix(  # formatted like a rule's shell command: literal braces are doubled
    "set -euo pipefail; "
    f"export PYTHONPATH={shlex.quote(str(ROOT))}" + '"${{PYTHONPATH:+:$PYTHONPATH}}"; '
    f"PY={'python' if _CONDA else shlex.quote(sys.executable)}; "
    "UNTIMED='nice -n 19'; "  # every job but generation: a timed run beside it loses ~nothing (docs/speed.md)
)
ENVS = ROOT / "workflow" / "envs"
CELL_FILE = str(PATHS.cell_file("{cell}"))  # one cell's settings and dimensions, the jobs' only source of them
WANDB = _checked["wandb"]
TIMING = json.dumps(_checked["timing"], sort_keys=True)  # how samples are timed and judged
MODELS = models_to_prepare(_checked, CELLS)
LIKELIHOOD = job_specs(_checked, CELLS)  # task -> its likelihood job's spec
DERIVED = {c: e.dims.samples_from for c, e in CELLS.items() if e.dims.samples_from}  # cell -> its samples' source


def CELL(kind, cell="{cell}"):
    """A cell's file of kind ``kind`` (pipeline/experiment/paths.py), for a cell or the ``{cell}`` wildcard."""
    return str(PATHS.cell(cell, kind))


def cells_regex(cells):
    """A wildcard constraint that matches exactly ``cells`` (none: nothing)."""
    return "|".join(re.escape(c) for c in cells) or "^$"


wildcard_constraints:
    cell=cells_regex(CELLS),
    model="|".join(re.escape(m) for m in MODELS),
    task="|".join(re.escape(t) for t in LIKELIHOOD) or "^$",


def cell_dims(wildcards):
    return CELLS[wildcards.cell].dims


def generate_threads(wildcards):
    """A generation job's threads: the config's; an E_p cell's at least one per model (its members'
    forwards run at once, pipeline/decoding/parallel.py)."""
    dims = cell_dims(wildcards)
    if dims.spec.parallel:
        return max(_checked["threads"], len(dims.models))
    return _checked["threads"]


def write_json(out, data, log):
    """A small file a local rule writes (a cell file, the grid index, the timing settings), atomically."""
    from pipeline.files import write_atomic

    write_atomic(Path(out), json.dumps(data, indent=1, sort_keys=True) + "\n")
    Path(log).write_text(f"wrote {out}\n")


def env(name):
    return str(ENVS / f"{name}.yaml")


def final_outputs():
    """The default target's inputs: the aggregate outputs only (each of them depends on every cell)."""
    out = [str(PATHS.summary), str(PATHS.cells_table)]
    if _checked["notebook"]:
        out.append(str(PATHS.notebook))
    if WANDB["mode"] != "disabled":
        out.append(str(PATHS.wandb))  # the experiment's run, after every cell's run
    return out


def hub_models():
    """The models fetched from the hub, by name, with their hub ids: fetch_model downloads them on the machine
    Snakemake runs on (where the network is), so that no compute job needs the network for them."""
    from pipeline.models.sources import locate
    from pipeline.models.spec import ModelSpec

    found = {m: locate(ModelSpec(**model_entry(_checked, m))) for m in MODELS}
    return {m: where for m, (kind, where) in found.items() if kind == "hub"}


HUB_MODELS = hub_models()


def speed_mem_mb(wildcards, input):
    """The judge's memory: small, unless a greedy cell's outputs part from its baseline's somewhere; then the
    float64 recompute (pipeline/job/exactness.py) loads each model on the CPU, one at a time: 8 bytes a parameter
    of the largest, and room for activations. Before the cell is generated (its judge submitted with its
    generation, in one group job) a greedy cell is sized for the recompute."""
    base = 2000
    cell = CELLS[wildcards.cell].cell
    if cell.temperature != 0 or not cell.baseline:
        return base
    if Path(input.samples).exists():
        rows = read_jsonl(input.samples, "samples file", links=False)  # bounded, never through a link
        if all(r["token_ids"] == r.get("baseline", r)["token_ids"] for r in rows):
            return base
    if missing := [m for m in input.models if not Path(m).exists()]:
        raise FileNotFoundError(2, "No such file or directory", missing[0])  # Snakemake sizes the job once it is
    largest = max(read_user_json(m, "model record", links=False).get("parameters", 0) for m in input.models)
    return base + int(largest * 8 * 1.25 / 1e6)
