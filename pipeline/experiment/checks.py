"""A workflow config checked end to end: ``config.py`` (read and checked), ``grid.py`` (expanded into cells),
then what can be checked on this machine before any job starts (``check_local``).

``python -m pipeline.experiment.checks CONFIG`` (or ``pipeline grid CONFIG``) does all three and lists the cells.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from .cell import CellFile
from .config import ConfigError, check_config
from .config_file import load_config_file
from .grid import expand_cells


def check_local(config: dict[str, Any], cells: dict[str, CellFile]) -> None:
    """What can be checked on this machine before any job starts, every problem at once (one line each)."""
    problems = local_problems(config, cells)[1]
    if len(problems) > 1:
        raise ConfigError(f"{len(problems)} problems before any job:\n" + "\n".join(f"  {p}" for p in problems))
    if problems:
        raise ConfigError(problems[0])


def local_problems(config: dict[str, Any], cells: dict[str, CellFile], gpu: str | None = None):
    """The models' preflight infos and every problem of data, model files, model sets and dataset sizes.

    Hub sources are checked only when the hub is offline (then they must be in the local hub cache).
    """
    from tasks import HubSkipped, TaskError, get_task

    from . import preflight
    from .context_check import check_context

    problems = []
    data_dir = config["data_dir"]
    if data_dir is not None and not Path(data_dir).expanduser().is_dir():
        problems.append(f"config key data_dir: directory {data_dir!r} not found")
        data_dir = None
    infos, found = preflight.run(config, cells, gpu)
    datasets = {(c.cell.task, json.dumps(c.cell.size)): c.cell for c in cells.values()}
    for cell in datasets.values():  # each dataset and size once (the seed is the config's)
        try:
            get_task(cell.task).load(cell.size, data_dir, cell.seed, hub=False)
        except HubSkipped:
            continue  # from the hub: fetched, and its size checked, when the job runs
        except TaskError as err:
            found.append(f"config key datasets.{cell.task}: {err}")
        except (OSError, ValueError) as err:  # a damaged local file
            found.append(f"config key datasets.{cell.task}: cannot read its data: {err}")
    if not problems + found:  # every prompt plus max_new_tokens fits its models' context
        try:
            check_context(cells, ConfigError)
        except ConfigError as err:
            found.append(str(err))
    return infos, problems + found


def load_checked(path: Path) -> tuple[dict[str, Any], dict[str, CellFile]]:
    """A config file checked and expanded into cells (ConfigError names what is wrong)."""
    config = check_config(load_config_file(path))
    return config, expand_cells(config)


def main(argv: list[str] | None = None) -> int:
    """``python -m pipeline.experiment.checks CONFIG``: check a config and list its cells."""
    import argparse

    ap = argparse.ArgumentParser(prog="pipeline grid", description="check a workflow config and list its cells")
    ap.add_argument("config", type=Path)
    args = ap.parse_args(argv)
    try:
        config, cells = load_checked(args.config)
        check_local(config, cells)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print("\n".join(cells))
    print(f"{len(cells)} cells", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
