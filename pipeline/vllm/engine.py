"""The generation job's side of vLLM: a worker process per method (``worker.py``, in vLLM's environment), called
like the decoder.

A ``vllm*`` cell's job stays in the project's environment (its journal, timing, judge and scoring are the same
as every cell's) and hands each generation to a worker over JSON lines: prompt ids, seed and sampling go in;
token ids, wall time and vLLM's spec-decode counters come out. The method and its baseline (``vllm``) each get
a worker of their own, since vLLM fixes its speculation when an engine starts; both live for the whole job and
run one at a time. :class:`VLLMRun` is called as ``partial(generate, ...)`` is for our methods and returns a
``GenerationResult``; its ``pids`` tell the job's timing probe whose CPU time and waits to read
(``measure.timing.Probe``).

Each worker runs vLLM in its own process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``: no engine-core process beside
it), with the job's thread count (OpenMP's and numba's, whose pool vLLM's n-gram proposer starts), no CPU pinning
(two jobs run at once on a 2-core machine), the KV cache sized for one sequence, the hub offline, and eager unless
the cell says ``eager: false`` (docs/vllm.md). Its dozens of helper threads (gloo loops) are not timed as the run:
the probe counts the waits of the threads that compute (``measure.timing``).
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..decoding.engines import ENGINES
from ..decoding.member import Stopper
from ..decoding.methods import GenerationResult
from ..decoding.peers import cut_at_stop
from ..decoding.spec import DRAFT, parse_method
from ..decoding.stats import GenerationStats, ModelStats
from ..errors import UserError
from ..files import parse_json
from ..records import read_record, record_problems

WORKER = Path(__file__).with_name("worker.py")
NGRAM = {"prompt_lookup_max": 4, "prompt_lookup_min": 2}  # our ``lookup`` proposer's n-gram sizes (lookup.py)
KV_CACHE_GIB = 1  # per worker: room for thousands of tokens of a small model, one sequence at a time
GPU_SHARE = 0.4  # on a GPU, each of a job's two workers (method, baseline) takes this share of its memory


class VLLMError(UserError):
    """A vLLM worker could not start or answer (one line: vLLM's own reason)."""


def speculative_config(
    method: str, gamma: int, paths: Sequence[str], eagle: str | None = None
) -> dict[str, Any] | None:
    """vLLM's ``speculative_config`` for a method: None for ``vllm``; else the method's ``speculator``
    (``decoding/engines.py``) proposing ``gamma`` tokens a step: the set's draft (``vllm_sd``), prompt lookup
    (``vllm_ngram``) or the first model's head as an EAGLE or EAGLE-3 checkpoint ``eagle`` (``vllm_eagle``,
    ``vllm_eagle3``: ``eagle.checkpoint``)."""
    spec = parse_method(method)
    if spec.engine is not ENGINES["vllm"]:
        raise UserError(f"{method!r} is not one of vLLM's methods")
    if not spec.peer:
        return None
    speculator = spec.peer_speculator
    if spec.peer_proposer == DRAFT:
        return {"method": speculator, "model": str(paths[1]), "num_speculative_tokens": gamma}
    if spec.peer_reads_features:
        if eagle is None:
            raise UserError(f"{method!r} needs the first model's feature head as an EAGLE checkpoint")
        return {"method": speculator, "model": str(eagle), "num_speculative_tokens": gamma}
    return {"method": speculator, "num_speculative_tokens": gamma, **NGRAM}


def worker_env(threads: int, build: str = "cpu") -> dict[str, str]:
    """The worker's environment: this one's, with vLLM told to stay in one process on ``threads`` threads (and,
    for the CPU build, that it is one: vLLM otherwise reads its platform from the version of a distribution named
    ``vllm``, which the CPU build's is not)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    if build == "cpu":
        env["VLLM_TARGET_DEVICE"] = "cpu"
    env.update(
        OMP_NUM_THREADS=str(threads),
        NUMBA_NUM_THREADS=str(threads),  # vLLM's n-gram proposer runs numba's parallel loops: one pool per core
        MKL_NUM_THREADS=str(threads),
        VLLM_ENABLE_V1_MULTIPROCESSING="0",
        VLLM_CPU_OMP_THREADS_BIND="nobind",  # pinning would put two jobs' workers on one core
        VLLM_CPU_KVCACHE_SPACE=str(KV_CACHE_GIB),
        VLLM_NO_USAGE_STATS="1",
        DO_NOT_TRACK="1",
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        VLLM_LOGGING_LEVEL=os.environ.get("VLLM_LOGGING_LEVEL", "WARNING"),
        TOKENIZERS_PARALLELISM="false",
    )
    return env


START_S = 1800.0  # seconds a worker may take to load its engine (a CPU build compiles kernels on first use)
ANSWER_S = 900.0  # seconds one generation may take before the worker is taken for hung


def reply_problem(reply: dict[str, Any], kind: str = "vLLM worker answer") -> str | None:
    """What is wrong with a worker's line (``worker.py``; its schema, ``records.py``: ready with its versions and
    load time, or an answer of token ids, wall time and vLLM's counters), or None. The ids' vocabulary is the
    run's to check."""
    problems = record_problems(kind, reply, "")
    return problems[0].removeprefix(": ") if problems else None


class Worker:
    """One vLLM engine in a process of its own (``worker.py``). Its answers are JSON lines, each checked as it
    arrives; one that does not come within ``START_S`` (the engine's start) or ``ANSWER_S`` (a generation) stops
    the worker with a one-line error, as does one that is not what ``worker.py`` writes."""

    def __init__(self, python: str, settings: dict[str, Any], threads: int, log=None, build: str = "cpu"):
        self.settings = settings
        self.proc = subprocess.Popen(
            [python, str(WORKER), json.dumps(settings)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=log if log is not None else sys.stderr,
            env=worker_env(threads, build),
            text=True,
        )
        self._lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()
        first = self._read(START_S, "its start")
        if "error" in first:
            self.close()
            raise VLLMError(f"vLLM could not start {settings['model']}: {str(first['error'])[:300]}")
        if problem := reply_problem(first, "vLLM worker start"):
            self.stop(f"said it was ready, but {problem} ({json.dumps(first)[:80]})")
        self.versions, self.load_s = first["versions"], first["load_s"]

    @property
    def pid(self) -> int:
        return self.proc.pid

    def _pump(self) -> None:
        """Hand the worker's lines to ``_read`` (a thread: a read from a pipe cannot be given a time limit)."""
        for line in self.proc.stdout:
            self._lines.put(line)
        self._lines.put(None)

    def stop(self, why: str) -> None:
        """Kill the worker and raise the one line saying ``why``."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        raise VLLMError(f"vLLM's worker for {self.settings['model']} {why}; it was stopped (its log says more)")

    def _exited(self) -> None:
        """The worker closed its end: its exit code (a process that closed its output but lingers is killed)."""
        try:
            code = self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.stop("closed its output but did not exit")
        raise VLLMError(f"vLLM's worker for {self.settings['model']} exited (code {code}); its log says why")

    def _read(self, within: float, what: str) -> dict[str, Any]:
        try:
            line = self._lines.get(timeout=within)
        except queue.Empty:
            self.stop(f"did not answer within {within:g} s ({what})")
        if line is None:
            self._exited()
        try:
            value = parse_json(line, "vLLM's worker", constants=False)  # bounded; NaN and Infinity are not JSON
        except ValueError:
            value = None
        if not isinstance(value, dict):
            self.stop(f"answered {line.strip()[:80]!r} ({what}), not a JSON object")
        return value

    def ask(self, request: dict[str, Any]) -> dict[str, Any]:
        try:
            self.proc.stdin.write(json.dumps(request) + "\n")
            self.proc.stdin.flush()
        except OSError:  # a broken pipe: the worker is gone
            self._exited()
        reply = self._read(ANSWER_S, "a generation")
        if problem := reply_problem(reply):
            self.stop(f"answered a generation that is not one: {problem}")
        return reply

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def stats_of(method: str, reply: dict[str, Any], prompt_tokens: int, new_tokens: int) -> GenerationStats:
    """Our record of one vLLM generation: its wall time and, from vLLM's spec-decode counters, the target's steps
    (each yields one token of its own beside the drafts it accepts), the drafts proposed and accepted.

    vLLM's counters count the drafts its last step accepted even where ``max_tokens`` cut them off the output.
    Where every step drafts (a draft model, EAGLE: the prompt's step makes one token, each step after it one
    beside those it accepts), the tokens made give the drafts cut off, and they are not counted accepted, as
    ours stop at the limit; prompt lookup skips steps it finds no n-gram for, so its count stays vLLM's. The
    per-position counts stay vLLM's."""
    spec, made = parse_method(method), len(reply["token_ids"])
    accepted = reply["accepted"]
    if spec.peer_proposer == DRAFT or spec.peer_reads_features:  # each step after the prompt's: 1 + drafts + accepted
        accepted -= max(0, reply["drafts"] + accepted - made)  # tokens made, where max_tokens cut none off
    steps = made - accepted
    stats = GenerationStats(method=method, prompt_tokens=prompt_tokens, new_tokens=new_tokens)
    stats.wall_time_s = reply["wall_s"]
    stats.models = [ModelStats(forward_calls=steps)]
    if spec.peer:
        drafted = ModelStats(
            forward_calls=reply["drafts"] if spec.peer_proposer == DRAFT else 0,
            proposed=reply["draft_tokens"],
            verified=reply["draft_tokens"],
            accepted=accepted,
        )
        if spec.peer_proposer == DRAFT:
            stats.models.append(drafted)
        else:
            stats.proposers = {spec.peer_proposer: drafted}  # lookup, or eagle: as our proposers are named
        stats.rounds, stats.accepted = reply["drafts"], accepted
        stats.position_accepted = list(reply["accepted_per_pos"])
        stats.position_verified = [reply["drafts"]] * len(stats.position_accepted)  # vLLM's own denominator
    else:
        stats.rounds, stats.accepted = None, None
    return stats


def vocab_size(model: str, tokenizer: Any) -> int:
    """The ids the model can emit: its head's rows (``config.json``'s ``vocab_size``, a padded head included), at
    least the tokenizer's."""
    try:
        size = read_record(Path(model) / "config.json", "config.json", "model config")["vocab_size"]
    except UserError:  # unreadable or not a model's: the tokenizer's size
        size = 0
    return max(len(tokenizer), size)


class VLLMRun:
    """A cell's runs in vLLM, called as the decoder is: ``run(prompt_ids, method, method_args=, seed=, ...)``."""

    def __init__(
        self,
        python: str,
        paths: Sequence[str],
        tokenizer: Any,
        eos_ids: set[int],
        threads: int,
        *,
        gamma: int | list[int] = 1,
        gamma_schedule: str = "fixed",
        max_new_tokens: int = 128,
        temperature: float = 0.0,
        top_k: int = 0,
        top_p: float = 1.0,
        dtype: str = "float32",
        gpu: bool = False,
        eagle: str | None = None,
        log=None,
    ):
        if gamma_schedule != "fixed":
            raise UserError(f"gamma_schedule={gamma_schedule!r}: vLLM's speculation takes a fixed gamma")
        self.python, self.paths, self.tokenizer, self.eos_ids = python, list(paths), tokenizer, eos_ids
        self.threads, self.dtype, self.gpu, self.eagle, self.log = threads, dtype, gpu, eagle, log
        self.gamma = gamma[-1] if isinstance(gamma, list) else gamma
        self.sampling = {"temperature": temperature, "top_k": top_k, "top_p": top_p}
        self.max_new_tokens = max_new_tokens
        self.vocab = vocab_size(self.paths[0], tokenizer)
        self.workers: dict[str, Worker] = {}

    def worker(self, method: str, method_args: dict[str, Any]) -> Worker:
        """The worker of ``method`` (started on first use)."""
        key = json.dumps([method, method_args], sort_keys=True)
        if key not in self.workers:
            settings = {
                "model": str(self.paths[0]),
                "dtype": self.dtype,
                "enforce_eager": bool(method_args.get("eager", True)),
                "speculative_config": speculative_config(method, self.gamma, self.paths, self.eagle),
                "max_model_len": 4096,
                "gpu_share": GPU_SHARE if self.gpu else None,
                "expand_fix": parse_method(method).peer_corrected is not None,  # vLLM #55005 corrected in the worker
            }
            build = "gpu" if self.gpu else "cpu"
            self.workers[key] = Worker(self.python, settings, self.threads, self.log, build)
        return self.workers[key]

    @property
    def pids(self) -> list[int]:
        return [w.pid for w in self.workers.values()]

    @property
    def versions(self) -> dict[str, str]:
        return next(iter(self.workers.values())).versions if self.workers else {}

    def __call__(
        self,
        prompt_ids: Sequence[int],
        method: str,
        method_args: dict[str, Any] | None = None,
        seed: int = 0,
        max_new_tokens: int | None = None,
        stop_strings: Sequence[str] = (),
        **ignored: Any,
    ) -> GenerationResult:
        args = {**parse_method(method).accepted_args(), **(method_args or {})}
        limit = self.max_new_tokens if max_new_tokens is None else max_new_tokens
        prompt = list(prompt_ids)
        request = {
            "prompt_ids": prompt,
            "seed": seed,
            "max_new_tokens": limit,
            "stop_ids": sorted(self.eos_ids),
            "stop_strings": list(stop_strings),
            **self.sampling,
        }
        worker = self.worker(method, args)
        reply = worker.ask(request)
        if outside := [t for t in reply["token_ids"] if t >= self.vocab]:
            worker.stop(f"answered token id {outside[0]}, outside the model's vocabulary of {self.vocab}")
        stopper = Stopper(limit, self.eos_ids, stop_strings, self.tokenizer.decode)
        tokens, reason = cut_at_stop(reply["token_ids"], prompt, stopper, "vllm")
        stats = stats_of(method, reply, len(prompt), len(tokens))
        stats.stop_reason = reason
        text = self.tokenizer.decode(tokens, skip_special_tokens=True)
        resolved = {**args, "gamma": self.gamma} if parse_method(method).peer else args
        return GenerationResult(tokens, stats, text, resolved)

    def close(self) -> None:
        for w in self.workers.values():
            w.close()

    def __enter__(self) -> VLLMRun:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
