# Config loading and checking, the grid of cells, shared paths.
import json
import re
import shlex
import sys
from pathlib import Path

import yaml
from snakemake.utils import min_version, update_config, validate

min_version("8.0")

ROOT = Path(workflow.basedir)
sys.path.insert(0, str(ROOT))  # the pipeline package, also when it is not installed

from pipeline.workflow import (
    ConfigError,
    check_config,
    check_local,
    expand_cells,
    load_config_file,
    load_schema,
    model_entry,
    models_to_prepare,
)

try:
    for _file in workflow.overwrite_configfiles:  # Snakemake's YAML reader keeps the last of duplicate keys
        load_config_file(_file)
    if not workflow.overwrite_configfiles:  # no --configfile: the embedded default, under any --config values
        _base = load_config_file(ROOT / "config" / "default.yaml")
        update_config(_base, dict(config))
        config.clear()
        config.update(_base)
    _checked = check_config(dict(config), load_schema(ROOT / "workflow" / "schemas" / "config.schema.yaml"))
    validate(config, str(ROOT / "workflow" / "schemas" / "config.schema.yaml"), set_default=True)
    CELLS = expand_cells(_checked)
    check_local(_checked, CELLS)
except ConfigError as err:
    sys.stderr.write(f"error: {err}\n")
    sys.exit(2)

RESULTS = _checked["results"].rstrip("/")
# the jobs' Python: this interpreter, with the repository importable (also for an uninstalled checkout)
PY = f'PYTHONPATH="{ROOT}${{PYTHONPATH:+:$PYTHONPATH}}" {shlex.quote(sys.executable)}'
WANDB = _checked["wandb"]
# how samples are timed and judged: given to the jobs outside their tracked params, so changing it
# re-judges finished cells (the speed rule) and never regenerates a sample
TIMING = json.dumps(_checked["timing"], sort_keys=True)
MODELS = models_to_prepare(_checked, CELLS)
GEN = f"{RESULTS}/generations"


wildcard_constraints:
    cell="|".join(re.escape(c) for c in CELLS),
    model="|".join(re.escape(m) for m in MODELS),


def cell_dims(wildcards):
    return CELLS[wildcards.cell]["dims"]


def final_outputs():
    out = [f"{RESULTS}/tables/summary.md", f"{RESULTS}/tables/cells.csv"]
    if _checked["notebook"]:
        out.append(f"{RESULTS}/analysis.ipynb")
    if WANDB["mode"] != "disabled":
        out += [f"{GEN}/{c}.wandb.json" for c in CELLS]
    return out
