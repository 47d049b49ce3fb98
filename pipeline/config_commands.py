"""The ``pipeline`` subcommands that check a workflow config before it runs: its cells, its models, its cost."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .commands import arg, command
from .errors import UserError


@command("grid", "check a workflow config and list its cells", arg("config", type=Path))
def cmd_grid(args: argparse.Namespace) -> int:
    from .workflow import main as grid_main

    return grid_main([str(args.config)])


@command(
    "preflight",
    "check a config's models and model sets from their files (no weights), every problem at once",
    arg("config", type=Path),
    arg("--gpu", help="the GPU of a generation job (as in 'pipeline estimate'); default: the profile's gpu_model"),
    arg(
        "--profile",
        type=Path,
        default=Path(__file__).parents[1] / "workflow/profiles/slurm/config.yaml",
        help="a Snakemake profile: its generation jobs' gpu_model and mem_mb",
    ),
)
def cmd_preflight(args: argparse.Namespace) -> int:
    """The models table, then every problem (one line each); 1 when any."""
    from .estimate import host_problems, profile_generate, profile_gpu
    from .preflight import table
    from .workflow import load_checked, local_problems

    config, cells = load_checked(args.config)
    profile = args.profile if args.profile and args.profile.exists() else None
    gpu = args.gpu or (profile_gpu(profile) if profile else None)
    infos, problems = local_problems(config, cells, gpu)
    mem_mb = profile_generate(profile).get("mem_mb") if profile else None
    if isinstance(mem_mb, int | float):
        problems += host_problems(cells, infos, mem_mb)
    print("\n".join(table(infos)))
    sets = len({tuple(c.dims.models) for c in cells.values()})
    memory = f"against one {gpu}" if gpu else "not checked (no gpu_model in the profile; give --gpu)"
    print(f"{len(infos)} models, {sets} model sets, {len(cells)} cells; GPU memory {memory}")
    for problem in problems:
        print(f"error: {problem}", file=sys.stderr)
    print(f"{len(problems)} problems" if problems else "no problems found", file=sys.stderr)
    return 1 if problems else 0


@command(
    "estimate",
    "forecast a config's jobs per rule and GPU-hours before it is submitted",
    arg("config", type=Path),
    arg("--gpu", default="a100-80gb", help="a GPU of the table (an unknown one: the closest and --bandwidth)"),
    arg("--bandwidth", type=float, help="memory bandwidth in GB/s, for a GPU not in the table"),
    arg("--acceptance", type=float, help="assumed acceptance of a proposed token (default: printed)"),
    arg("--efficiency", type=float, help="fraction of the bandwidth bound forwards reach (default: printed)"),
    arg("--floor-ms", type=float, help="least time of a forward (default: 2.4 ms on a GPU, 0 on the cpu)"),
    arg("--json", action="store_true", help="machine-readable output"),
)
def cmd_estimate(args: argparse.Namespace) -> int:
    """The forecast as a table, or JSON."""
    from .estimate import ACCEPTANCE, EFFICIENCY, GPU_EFFICIENCY, as_json, forecast, report, settings, settings_line
    from .preflight import inspect_config, models_to_prepare
    from .workflow import load_checked

    name, gpu, floor = settings(args)
    acceptance = ACCEPTANCE if args.acceptance is None else args.acceptance
    efficiency = EFFICIENCY.get(name, GPU_EFFICIENCY) if args.efficiency is None else args.efficiency
    if not 0 <= acceptance < 1 or not 0 < efficiency <= 1:
        raise UserError(f"--acceptance {acceptance} / --efficiency {efficiency}: expected 0 <= a < 1, 0 < e <= 1")
    config, cells = load_checked(args.config)
    dtype = "float32" if name.startswith("cpu") else "bfloat16"
    infos = inspect_config(config, models_to_prepare(config, cells), dtype)
    unknown = [p for i in infos.values() if i.config is None for p in i.problems or [f"{i.name}: {i.where}"]]
    if unknown:  # shapes are all it needs (a missing tokenizer is the preflight's to report)
        raise UserError(f"{unknown[0]} ({len(unknown)} without shapes; 'pipeline preflight {args.config}' lists all)")
    result = forecast(config, cells, infos, gpu, efficiency, floor, acceptance)
    if args.json:
        print(json.dumps(as_json(result, name, gpu, efficiency, floor, acceptance), indent=2))
        return 0
    print(settings_line(name, gpu, efficiency, floor, acceptance))
    print("\n".join(report(result, name)))
    return 0
