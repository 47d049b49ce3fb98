"""How a generation job runs a cell in vLLM (vLLM's behaviour, ``engines/vllm.py``: ``runs``): workers in vLLM's own
environment (``env.py``), one per model set (``engine.py``), logging to the job's log."""

from __future__ import annotations

from contextlib import ExitStack
from functools import partial
from typing import Any

import torch

from ..decoding.engines import Runs, RunsCell
from ..decoding.spec import parse_method
from ..errors import UserError
from ..provenance import provenance
from . import env as vllm_env
from .engine import VLLMRun


def vllm_runs(cell: RunsCell, stack: ExitStack) -> Runs:
    """The cell's runs in vLLM (``pipeline/vllm``): workers in vLLM's environment, logging to the job's log."""
    from ..models.loading import load_tokenizer
    from ..models.resolve import resolve

    record = vllm_env.ready()
    if record is None:
        raise UserError(
            f"{cell.method!r} runs in vLLM's environment, which is not built here ({vllm_env.env_dir(vllm_env.build())}"
            "); the workflow's vllm_env rule builds it, or: python -m pipeline.vllm.env"
        )
    paths = [str(resolve(spec)) for spec in cell.models]
    eagle, method = None, parse_method(cell.method)
    if method.peer_reads_features:  # the first model's feature head, as vLLM's EAGLE or EAGLE-3 model
        from ..models.resolve import ensure_head
        from .eagle import checkpoint

        eagle = str(checkpoint(ensure_head(cell.models[0]), method.peer_speculator))
    tokenizer = load_tokenizer(paths[0])
    threads = torch.get_num_threads()
    gpu = record["build"] == "gpu"
    dtype = cell.models[0].dtype or ("bfloat16" if gpu else "float32")  # the target's, as ours loads it (ModelSpec)
    run = stack.enter_context(
        VLLMRun(
            record["python"],
            paths,
            tokenizer,
            {tokenizer.eos_token_id},
            threads,
            dtype=dtype,
            gpu=gpu,
            eagle=eagle,
            **cell.sampling(),
        )
    )

    def prepare(prompts: dict[str, list[int]]) -> dict[str, Any]:
        versions = run.versions
        fixed = f" with {corrected}" if (corrected := parse_method(cell.method).peer_corrected) else ""
        return {
            **provenance("cuda" if gpu else "cpu"),  # its threads: the job's, as the workers' (torch's count)
            "engine": f"vllm {versions.get('vllm')} ({record['build']}){fixed}, torch {versions.get('torch')}",
        }

    text = partial(tokenizer.decode, skip_special_tokens=True)
    return Runs(run, tokenizer, prepare, run.vocab, text, pids=lambda: run.pids)
