"""Quality by log-likelihood: lm-eval's multiple-choice tasks scored once per distinct distribution of a grid
(docs/quality.md, "How it is computed").

A method's log-likelihood is that of the distribution its tokens are drawn from
(``lm_eval_model.target_distribution``): a lossless accelerated method shares its standard method's, so a grid's
cells map to their distributions (``distribution``) and one job scores a task under all of them (``score_task``):
lm-eval builds the requests and computes the metrics, each model's rows are shared by every distribution that
holds it, and each metric gets its interval (``pipeline.measure.intervals``) from the per-question values, kept in
the file.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from .. import ROOT
from ..errors import UserError
from ..files import write_atomic
from ..measure.intervals import CONFIDENCE, interval

if TYPE_CHECKING:
    from ..experiment.cell import CellFile

LM_EVAL_TASKS = ROOT / "tasks" / "lm_eval"
SCORED = ("multiple_choice", "loglikelihood")  # lm-eval output types scored by log-likelihood alone
PROGRESS = 50  # a line in the job's log every this many contexts


def distribution(method: str, models: list[str], method_args: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """The distribution a method of a model set draws its tokens from: its id and what scores it
    (``method``: ``large_model``, ``small_model`` or an ensemble's name; ``models``; resolved ``args``)."""
    from ..decoding.spec import parse_method

    spec = parse_method(method)
    if spec.ensemble is None:  # large_model, sd and the large model's peers (vLLM's too); small_model
        name = models[-1] if spec.base == "small_model" else models[0]
        return name, {
            "method": "small_model" if spec.base == "small_model" else "large_model",
            "models": [name],
            "args": {},
        }
    params = {k: v for k, v in method_args.items() if k in spec.ensemble.params and v is not None}
    args = parse_method(spec.base).check(len(models), params)  # the standard ensemble's own, resolved form
    text = " ".join(f"{k}={_text(v)}" for k, v in sorted(args.items()) if v is not None)
    return f"{spec.base}({text}): {' + '.join(models)}", {"method": spec.base, "models": list(models), "args": args}


def _text(value: Any) -> str:
    return "/".join(f"{v:g}" for v in value) if isinstance(value, list) else f"{value:g}"


def grid_distributions(cells: dict[str, CellFile]) -> dict[str, dict[str, Any]]:
    """The distinct distributions of a grid's cells (``grid.expand_cells``), each with the methods it scores
    for (``uses``: ``method (model set)``), in the cells' order."""
    out: dict[str, dict[str, Any]] = {}
    for c in cells.values():
        dims = c.dims
        key, entry = distribution(dims.method, dims.models, c.cell.method_args)
        out.setdefault(key, {**entry, "uses": []})
        use = f"{dims.method} ({dims.model_set})"
        if use not in out[key]["uses"]:
            out[key]["uses"].append(use)
    return out


def job_specs(config: dict[str, Any], cells: dict[str, CellFile]) -> dict[str, dict[str, Any]]:
    """One job per task of ``likelihood_tasks``: what ``pipeline likelihood`` reads (the task, its limit, the
    grid's distributions, the model entries they use)."""
    from ..experiment.config import model_entry
    from ..experiment.preflight import mixed_tokenizers

    tasks = config.get("likelihood_tasks") or {}
    if not tasks:
        return {}
    # a continuation's log-likelihood is defined over one tokenization: sets whose members tokenize differently
    # (a student with a tokenizer of its own) are not scored
    dists = {k: d for k, d in grid_distributions(cells).items() if not mixed_tokenizers(config["models"], d["models"])}
    names = sorted({m for d in dists.values() for m in d["models"]})
    common = {
        "distributions": dists,
        "models": {m: model_entry(config, m) for m in names},
    }
    return {task: {"task": task, "limit": (opts or {}).get("limit"), **common} for task, opts in tasks.items()}


def member_rows(
    model, context: list[int], continuations: list[list[int]], vocab: int | None = None
) -> list[torch.Tensor]:
    """Logits rows ``[len(c), V]`` (float64, CPU) predicting each continuation ``c`` after ``context``: one
    forward over the context, kept in the KV cache, then one over every continuation but its last token at
    once, a batch over the cache (right-padded: a causal model's real positions never see the padding).
    ``vocab``: the rows kept of the head (``models.token_rows``: a padded head cropped to the tokenizer)."""
    device = next(model.parameters()).device
    with torch.inference_mode():
        first = model(input_ids=torch.tensor([context], device=device), use_cache=True, logits_to_keep=1)
        row = first.logits[0, -1:, :vocab].to("cpu", torch.float64)
        longer = [c for c in continuations if len(c) > 1]
        if not longer:
            return [row] * len(continuations)
        width = max(len(c) for c in longer) - 1
        batch = torch.tensor([c[:-1] + [c[0]] * (width - len(c) + 1) for c in longer], device=device)
        cache = first.past_key_values
        cache.batch_repeat_interleave(len(longer))
        logits = model(input_ids=batch, past_key_values=cache, use_cache=True).logits[..., :vocab]
        logits = logits.to("cpu", torch.float64)
    rest = iter(range(len(longer)))
    return [row if len(c) == 1 else torch.cat([row, logits[next(rest), : len(c) - 1]]) for c in continuations]


def _lm_class():
    from lm_eval.api.model import TemplateLM

    from .lm_eval_model import SpecEnsLM, combine, score_continuation

    class DistributionsLM(TemplateLM):
        """An lm-eval model scoring each request under several distributions at once: ``loglikelihood`` returns,
        per request, ``{distribution: (log-likelihood, is_greedy)}``."""

        eot_token_id = SpecEnsLM.eot_token_id
        prefix_token_id = SpecEnsLM.prefix_token_id
        tok_encode = SpecEnsLM.tok_encode

        def __init__(self, models: list, tokenizer, targets: dict[str, tuple[list[int], Any]], max_length: int):
            from ..models import token_rows

            super().__init__()
            self.models, self.tokenizer, self.targets, self.max_length = models, tokenizer, targets, max_length
            self.vocab = token_rows(models, tokenizer)  # padded heads cropped to the tokenizer

        def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, **kwargs: Any) -> list[dict]:
            windows = []
            for _, context, continuation in requests:  # the window SpecEnsLM scores, cut from the left
                n = len(continuation)
                if not 0 < n <= self.max_length:
                    raise UserError(f"a continuation of {n} tokens: expected 1 to max_length={self.max_length}")
                windows.append(((context + continuation)[-(self.max_length + 1) : -n], continuation))
            used = sorted({i for members, _ in self.targets.values() for i in members})
            out = []
            groups = itertools.groupby(windows, key=lambda w: w[0])  # a question's answers, in turn
            for k, (context, group) in enumerate(groups, 1):
                if k % PROGRESS == 0:
                    print(f"{k} contexts scored", flush=True)
                continuations = [c for _, c in group]
                rows = {i: member_rows(self.models[i], context, continuations, self.vocab) for i in used}
                for j, c in enumerate(continuations):
                    out.append(
                        {
                            name: score_continuation(combine(fn, [rows[i][j] for i in members]), c)
                            for name, (members, fn) in self.targets.items()
                        }
                    )
            return out

        def loglikelihood_rolling(self, requests, disable_tqdm: bool = False):
            raise NotImplementedError

        def generate_until(self, requests, disable_tqdm: bool = False):
            raise NotImplementedError

    return DistributionsLM


def load_distributions(distributions: dict[str, dict[str, Any]], model_entries: dict[str, dict[str, Any]]):
    """Load every model the distributions use once, and the lm-eval model scoring all of them."""
    from ..models import ModelSpec, load_set
    from .lm_eval_model import target_distribution

    names = list(dict.fromkeys(m for d in distributions.values() for m in d["models"]))
    models, tokenizer = load_set([ModelSpec(**model_entries[m]) for m in names])
    targets = {}
    for key, d in distributions.items():
        index = [names.index(m) for m in d["models"]]
        members, fn = target_distribution(d["method"], [models[i] for i in index], 1, d["args"])
        targets[key] = ([index[i] for i in members], fn)
    from lm_eval.models.utils import resolve_max_length

    return _lm_class()(models, tokenizer, targets, resolve_max_length(models[0].config, tokenizer))


def lm_eval_task(name: str):
    """lm-eval's task ``name``: one of tasks/lm_eval (quick), else of the harness's own (indexed, about 25 s)."""
    from lm_eval.tasks import TaskManager

    for defaults in (False, True):
        manager = TaskManager(include_path=str(LM_EVAL_TASKS), include_defaults=defaults)
        if name in manager.all_tasks:
            break
    else:
        local = ", ".join(sorted(p.stem for p in LM_EVAL_TASKS.glob("*.yaml")))
        raise UserError(f"unknown lm-eval task {name!r}; accepted: the harness's tasks and {local}")
    leaves = list(manager.load([name])["tasks"].values())
    if len(leaves) != 1 or leaves[0].OUTPUT_TYPE not in SCORED:
        kind = "a group of tasks" if len(leaves) != 1 else f"scored by {leaves[0].OUTPUT_TYPE}"
        raise UserError(f"lm-eval task {name!r} is {kind}; expected one task of output type {' or '.join(SCORED)}")
    return leaves[0]


def score_task(name: str, lm, limit: int | None = None) -> dict[str, Any]:
    """lm-eval's task ``name`` scored under every distribution of ``lm``: per distribution, each metric with
    its interval and its per-question values (questions in lm-eval's order)."""
    task = lm_eval_task(name)
    task.build_all_requests(limit=limit, rank=0, world_size=1)
    instances = sorted(task.instances, key=lambda x: (x.doc_id, x.idx))
    results = lm.loglikelihood(instances, disable_tqdm=True)
    per_doc: dict[str, dict[str, list[float]]] = {key: {} for key in lm.targets}
    for _, group in itertools.groupby(zip(instances, results), key=lambda p: p[0].doc_id):
        group = list(group)
        for key in lm.targets:
            metrics = task.process_results(group[0][0].doc, [r[key] for _, r in group])
            for metric, value in metrics.items():
                per_doc[key].setdefault(metric, []).append(float(value))
    out = {}
    for key, values in per_doc.items():
        figures = {}
        for metric, v in values.items():
            low, high, how = interval(v)
            figures[metric] = {"value": sum(v) / len(v), "low": low, "high": high, "interval": how}
        out[key] = {"metrics": figures, "per_question": values}
    return {"task": name, "questions": len({x.doc_id for x in instances}), "confidence": CONFIDENCE, "scores": out}


def model_groups(distributions: dict[str, dict[str, Any]]) -> list[dict[str, dict[str, Any]]]:
    """The distributions in groups that share no model (the connected components of model sharing): each group's
    models are loaded together, one group at a time, so a grid of many model sets never holds all at once."""
    groups: list[tuple[set[str], dict[str, dict[str, Any]]]] = []
    for key, d in distributions.items():
        models, members = set(d["models"]), {key: d}
        for g in [g for g in groups if g[0] & models]:
            groups.remove(g)
            models |= g[0]
            members = {**g[1], **members}
        groups.append((models, members))
    return [{k: v for k, v in distributions.items() if k in g[1]} for g in groups]


def run(spec: dict[str, Any], out: Path, threads: int | None = None) -> dict[str, Any]:
    """Score the task of a job spec (``job_specs``), one group of model sets at a time; write the result to
    ``out``."""
    import gc

    if threads:
        torch.set_num_threads(threads)
    result: dict[str, Any] = {}
    for group in model_groups(spec["distributions"]):
        lm = load_distributions(group, spec["models"])
        found = score_task(spec["task"], lm, spec.get("limit"))
        result = {**found, "scores": {**result.get("scores", {}), **found["scores"]}}
        del lm
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    result["scores"] = {key: result["scores"][key] for key in spec["distributions"]}  # in the grid's order
    for key, d in spec["distributions"].items():
        result["scores"][key].update({k: d[k] for k in ("method", "models", "args", "uses") if k in d})
    write_atomic(Path(out), json.dumps(result, indent=1) + "\n")
    return result
