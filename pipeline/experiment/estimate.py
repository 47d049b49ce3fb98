"""A config's cost before it is submitted: jobs per rule and GPU-hours of its generation jobs (docs/cluster.md,
"Before submitting"). A forward costs at least ``bytes read / bandwidth`` (decoding one sequence is bound by memory
bandwidth); a speculative method's tokens per forward come from ``measure.cost.chain_speedup`` at an assumed
acceptance rate; the parameter counts are the preflight's (config.json shapes, no weights).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import UserError, one_line
from ..files import read_user_text

if TYPE_CHECKING:
    from ..models.files import ModelInfo
    from .cell import Cell, CellFile


@dataclass(frozen=True)
class Gpu:
    memory_gb: float
    bandwidth_gb_s: float  # memory bandwidth
    tflops: float  # dense bfloat16 tensor throughput (V100: float16, it has no bfloat16)


# From the public datasheets: NVIDIA A100 (SXM, 40/80 GB), H100 (SXM5), H200 (SXM), L40S, A10 (the A10G is
# its cloud variant: same 24 GB and 600 GB/s), V100 (SXM2 32 GB), and the Ada Lovelace whitepaper (GeForce
# RTX 4090, bfloat16 with float32 accumulation). 'cpu': this project's 2-core machine, as measured with
# pipeline.bench.runners.bandwidth (16 GB/s for one thread, one generation job of the default config) and a
# float32 matrix product (0.16 TFLOP/s for one thread).
GPUS = {
    "a100-40gb": Gpu(40, 1555, 312),
    "a100-80gb": Gpu(80, 2039, 312),
    "h100-80gb": Gpu(80, 3350, 989),
    "h200": Gpu(141, 4800, 989),
    "l40s": Gpu(48, 864, 362),
    "a10g": Gpu(24, 600, 125),
    "v100": Gpu(32, 900, 125),
    "rtx4090": Gpu(24, 1008, 165),
    "cpu": Gpu(23, 16, 0.16),
}
ACCEPTANCE = 0.7  # assumed per-token acceptance of a proposal when nothing better is known
# The fraction of the bandwidth bound the default (eager) runner reaches, and the least a forward costs (kernel
# launches): on an H100, 0.20 for the 7B shape and 2.4 ms for the 68M one (docs/cluster.md: The H100 figures); on the
# 'cpu' above, one thread, eager+pack, the bundled model: 57.4 ms a token against 33.7 at the bound.
EFFICIENCY, FLOOR_MS = {"cpu": 0.59}, {"cpu": 0.0}
GPU_EFFICIENCY, GPU_FLOOR_MS = 0.2, 2.4
# The compiled runner on a GPU (CUDA graphs): 0.57 of the bound for 7B and 0.75 ms for the 68M shape on an H100, and
# what each generation job spends compiling before it times anything: 300 s for a 1B target with a 68M draft
# (float32, 16 CPU cores; docs/cluster.md: The H100 figures), a lower bound for larger models and longer prompts
# (more layers, more cache sizes). Models on the compiled runner are forecast with these on a GPU; on the 'cpu'
# every runner has its figures above (its compile, minutes per model, is not counted).
COMPILED_EFFICIENCY, COMPILED_FLOOR_MS, COMPILE_S = 0.57, 0.75, 300.0
PROMPT_TOKENS = 512  # prompt tokens per example, for the prefill (compute bound)
KV_PROMPT_TOKENS = 2048  # the prompt length a KV cache is sized for in the memory check (beside max_new_tokens)
GPU_OVERHEAD_GB = 1.5  # the CUDA context, allocator slack and logits, per GPU
FULL_SIZES = {"humaneval": 164, "gsm8k": 1319, "mmlu": 14042, "cnndm": 11490}  # the public test splits
PER_CELL = ("cell", "generate", "speed", "score", "wandb_log")  # the workflow's rules: one job per cell
ONCE = ("timing", "grid", "aggregate", "notebook", "wandb_experiment", "all")


def gpu_spec(name: str) -> Gpu:
    key = match_gpu(name)
    if key is None:
        raise UserError(f"GPU {name!r} is not in the table; accepted: {', '.join(GPUS)} (or give --bandwidth)")
    return GPUS[key]


def match_gpu(name: str) -> str | None:
    """A table key for a GPU name (``A100``, ``h100``, ``a100-80gb``): the exact key, else the one with
    the least memory among those it starts (the conservative reading of a SLURM gpu_model)."""
    norm = name.lower().replace("_", "").replace("-", "").replace(" ", "")
    keys = {k.replace("-", ""): k for k in GPUS}
    if norm in keys:
        return keys[norm]
    found = [k for n, k in keys.items() if n.startswith(norm)]
    return min(found, key=lambda k: GPUS[k].memory_gb) if found else None


def profile_generate(profile: Path) -> dict[str, Any]:
    """The resources a Snakemake profile gives generation jobs (``set-resources: generate:``)."""
    import yaml

    try:
        data = yaml.safe_load(read_user_text(Path(profile), "profile")) or {}
    except yaml.YAMLError as err:
        raise UserError(f"profile {profile}: {one_line(err)}") from None
    for key, value in (
        ("(top level)", data),
        ("set-resources", data.get("set-resources") if isinstance(data, dict) else None),
    ):
        if value is not None and not isinstance(value, dict):
            shown = json.dumps(value, default=str)[:60]
            raise UserError(f"profile {profile}: {key} is {shown}, expected a mapping (rule: resources)")
    generate = (data.get("set-resources") or {}).get("generate") or {}
    if not isinstance(generate, dict):
        raise UserError(f"profile {profile}: set-resources.generate is not a mapping of resources")
    return generate


def profile_gpu(profile: Path) -> str | None:
    """The GPU model a SLURM profile asks for generation jobs (``gpu_model``), when it names one: a name, or a
    one-line error (a number such as ``5`` names no GPU)."""
    model = profile_generate(profile).get("gpu_model")
    if model is None:
        return None
    if not isinstance(model, str) or not model.strip():
        raise UserError(
            f"profile {profile}: set-resources.generate.gpu_model={json.dumps(model, default=str)[:40]} is not a GPU "
            "name (e.g. a100, h100)"
        )
    if (key := match_gpu(model)) is None:  # a name the table lacks is said, never read as no gpu_model at all
        raise UserError(
            f"profile {profile}: set-resources.generate.gpu_model={json.dumps(model)[:40]} is not a GPU of the "
            f"table; accepted: {', '.join(GPUS)} (or give --gpu)"
        )
    return key


def profile_mem_mb(profile: Path) -> int | float | None:
    """The host memory a SLURM profile gives generation jobs (``mem_mb``), when it gives some: a number of
    megabytes above 0, or a one-line error (``"lots"`` or ``true`` is no amount, never read as none)."""
    mem_mb = profile_generate(profile).get("mem_mb")
    if mem_mb is None:
        return None
    if isinstance(mem_mb, bool) or not isinstance(mem_mb, int | float) or not 0 < mem_mb < math.inf:
        raise UserError(
            f"profile {profile}: set-resources.generate.mem_mb={json.dumps(mem_mb, default=str)[:40]} is not "
            "accepted (megabytes, a number above 0)"
        )
    return mem_mb


def memory_problems(
    cells: dict[str, CellFile], infos: dict[str, ModelInfo], gpu_gb: float, gpu_label: str
) -> list[str]:
    """Each model set whose weights and KV caches exceed the GPU memory a generation job gets."""
    problems: dict[str, None] = {}
    for c in cells.values():
        names, tokens = c.dims.models, KV_PROMPT_TOKENS + c.cell.max_new_tokens
        members = [infos[n] for n in names]
        if any(m.weight_bytes() is None for m in members):
            continue
        need = [(m.weight_bytes() + m.kv_bytes(tokens)) / 1e9 for m in members]
        if sum(need) + GPU_OVERHEAD_GB > gpu_gb:
            parts = ", ".join(f"{m.name} {n:.1f} GB in {m.dtype}" for m, n in zip(members, need))
            problems[
                f"set {c.dims.model_set!r} needs {sum(need) + GPU_OVERHEAD_GB:.1f} GB ({parts}, with a KV "
                f"cache of {tokens} tokens, +{GPU_OVERHEAD_GB} GB) but a generation job gets {gpu_label}"
            ] = None
    return list(problems)


def host_problems(cells: dict[str, CellFile], infos: dict[str, ModelInfo], mem_mb: float) -> list[str]:
    """Each model set with a model larger than a generation job's host memory (weights pass through it)."""
    problems: dict[str, None] = {}
    for c in cells.values():
        sized = [infos[n] for n in c.dims.models if infos[n].weight_bytes() is not None]
        big = max(sized, key=lambda m: m.weight_bytes(), default=None)
        if big is not None and big.weight_bytes() / 1e6 > mem_mb:
            problems[
                f"set {c.dims.model_set!r}: {big.name} loads {big.weight_bytes() / 1e9:.1f} GB of weights "
                f"({big.dtype}) through host memory but a generation job asks for mem_mb={mem_mb:g}"
            ] = None
    return list(problems)


def prompts(cell: Cell) -> int:
    size = cell.size
    full = FULL_SIZES.get(cell.task)
    if size == "tiny":
        return 5
    if size == "small":
        return min(200, full or 200)
    if size == "full":
        if full is None:
            raise UserError(f"datasets.{cell.task}: size full has no known count here; give a number")
        return full
    return int(size)


def token_seconds(
    method: str, t: list[float], gamma: Any, proposer: str, acceptance: float, max_new_tokens: int | None = None
) -> float:
    """Seconds per generated token of ``method`` over members whose forwards cost ``t`` seconds each; a gamma past
    ``max_new_tokens`` counts as that many (the decoder never drafts past the tokens left)."""
    from ..decoding.proposers import DRAFT, parse_proposer
    from ..decoding.spec import parse_method
    from ..measure.cost import chain_speedup

    spec = parse_method(method)
    if spec.ensemble is None and not spec.speculative:  # one model of the set (a speculative cell's baseline)
        return t[-1] if method == "small_model" else t[0]
    if not spec.speculative:
        return sum(t) / len(t) if spec.mixture else sum(t)
    if spec.peer:
        target = sum(t) if spec.ensemble else t[0]
        draft = t[-1] if spec.peer_proposer == DRAFT else 0.0  # lookup and a feature head: as ours are counted
    else:
        target = t[0] if spec.name == "sd" else sum(t) / len(t) if spec.mixture else sum(t)
        draft = min(t) if parse_proposer(proposer).draft and len(t) > 1 else 0.0
    g = gamma[-1] if isinstance(gamma, list) else gamma  # a *_se list: the small model's gamma
    g = min(g, max_new_tokens) if max_new_tokens else g
    return target / chain_speedup(acceptance, g, {1: target}, {1: draft})


def forecast(
    config,
    cells,
    infos,
    gpu: Gpu,
    efficiency: float,
    floor_ms: float,
    acceptance: float,
    compiled: tuple[float, float, float] | None = None,
) -> dict:
    """Jobs per rule, and the hours of each cell's generation job and of all of them; ``compiled``: the
    efficiency, least forward time in ms and compile seconds per job of members on a compiled runner (None:
    the same figures as every other member, no compile time)."""
    hours: dict[str, float] = {}
    for cell_id, c in cells.items():
        if c.dims.samples_from:  # its samples are another cell's side-by-side runs (job/derive.py): no generation
            continue
        cell, members = c.cell, [infos[n] for n in c.dims.models]
        if any(m.read_bytes() is None for m in members):
            raise UserError(f"cell {cell_id}: the shapes of {', '.join(m.name for m in members)} are not known here")
        graphed = [compiled is not None and spec.runner != "eager" for spec in cell.models]
        t = [
            max(
                m.read_bytes() / (gpu.bandwidth_gb_s * 1e9 * (compiled[0] if g else efficiency)),
                (compiled[1] if g else floor_ms) / 1e3,
            )
            for m, g in zip(members, graphed)
        ]
        proposer = cell.method_args.get("proposer", "draft")  # the default proposer kind
        runs = [cell.method] + ([cell.baseline] if cell.baseline else [])
        per_token = sum(token_seconds(r, t, cell.gamma, proposer, acceptance, cell.max_new_tokens) for r in runs)
        used = [members[:1] if r == "large_model" else members[-1:] if r == "small_model" else members for r in runs]
        flops = PROMPT_TOKENS * 2 * sum(m.parameters for run in used for m in run)
        prefill = flops / (gpu.tflops * 1e12) if gpu.tflops else 0.0  # a GPU given by --bandwidth alone: none
        compiling = compiled[2] if any(graphed) else 0.0
        hours[cell_id] = (prompts(cell) * (cell.max_new_tokens * per_token + prefill) + compiling) / 3600
    wandb = config["wandb"]["mode"] != "disabled"
    jobs = {rule: len(cells) for rule in PER_CELL if rule != "wandb_log" or wandb}
    jobs["derive"] = sum(bool(c.dims.samples_from) for c in cells.values())
    jobs["generate"] -= jobs["derive"]
    jobs["prepare_model"] = len(infos)
    jobs["fetch_model"] = sum(i.where.startswith("hub") for i in infos.values())
    jobs |= {
        rule: 1 for rule in ONCE if (rule != "notebook" or config["notebook"]) and (rule != "wandb_experiment" or wandb)
    }
    if config.get("likelihood_tasks"):  # one job per task, every distribution of the grid in it
        jobs["likelihood"] = len(config["likelihood_tasks"])
    # on SLURM: each model's preparation, one group job per generated cell (generate, speed, score, and the cells
    # derived from it), one per likelihood task, one for the report
    submissions = len(infos) + jobs["generate"] + jobs.get("likelihood", 0) + 1
    return {"jobs": jobs, "submissions": submissions, "cell_hours": hours, "generate_hours": sum(hours.values())}


def report(result: dict, label: str) -> list[str]:
    unit = "job-hours" if label.startswith("cpu") else "GPU-hours"  # on the cpu, jobs' hours side by side
    rows = [f"| rule | jobs | {unit} |", "|---|---|---|"]
    for rule, n in sorted(result["jobs"].items(), key=lambda kv: -kv[1]):
        hours = f"{result['generate_hours']:.2f}" if rule == "generate" else ""
        rows.append(f"| {rule} | {n} | {hours} |")
    by_set: dict[str, float] = {}
    for cell_id, h in result["cell_hours"].items():
        key = cell_id.split("/")[1]
        by_set[key] = by_set.get(key, 0) + h
    rows += ["", f"| model set (all its cells) | {unit} |", "|---|---|"]
    rows += [f"| {k} | {v:.2f} |" for k, v in sorted(by_set.items(), key=lambda kv: -kv[1])]
    total = sum(result["jobs"].values())
    rows.append(f"\nSLURM submissions (the slurm profile's group jobs): {result['submissions']}")
    rows.append(f"total: {total} jobs, {result['generate_hours']:.2f} {unit} of generation on {label}")
    return rows


def settings_line(
    name: str, gpu: Gpu, efficiency: float, floor_ms: float, acceptance: float, compiled: tuple | None = None
) -> str:
    compute = f"{gpu.tflops:g} TFLOP/s" if gpu.tflops else "no TFLOP/s known (prefill not counted)"
    forwards = f"forwards at {efficiency:.0%} of the bandwidth bound, at least {floor_ms:g} ms"
    if compiled is not None:  # some model of the config is on the compiled runner
        forwards = (
            f"{forwards} on the eager runner; on the compiled one at {compiled[0]:.0%}, at least {compiled[1]:g} ms, "
            f"and {compiled[2]:g} s of compiling per generation job"
        )
    return (
        f"{name}: {gpu.bandwidth_gb_s:g} GB/s, {gpu.memory_gb:g} GB, {compute}; {forwards}; acceptance "
        f"{acceptance:g} (assumed); every answer {PROMPT_TOKENS} prompt tokens and max_new_tokens long"
    )


def settings(args) -> tuple[str, Gpu, float]:
    """The GPU of ``--gpu`` / ``--bandwidth`` and its least forward time in ms."""
    key = match_gpu(args.gpu)
    if key is None and args.bandwidth:  # a GPU not in the table: its bandwidth alone, no prefill
        return args.gpu, Gpu(0, args.bandwidth, 0), GPU_FLOOR_MS if args.floor_ms is None else args.floor_ms
    gpu = gpu_spec(args.gpu)
    floor = args.floor_ms if args.floor_ms is not None else FLOOR_MS.get(key, GPU_FLOOR_MS)
    if args.bandwidth:
        gpu, key = Gpu(gpu.memory_gb, args.bandwidth, gpu.tflops), f"{key} at {args.bandwidth:g} GB/s"
    return key, gpu, floor


def as_json(
    result: dict, name: str, gpu: Gpu, efficiency: float, floor_ms: float, acceptance: float, compiled=None
) -> dict:
    return {
        "gpu": name,
        **asdict(gpu),
        "efficiency": efficiency,
        "floor_ms": floor_ms,
        "compiled": dict(zip(("efficiency", "floor_ms", "compile_s"), compiled)) if compiled else None,
        "acceptance": acceptance,
        **result,
    }
