"""The shared decoder as an lm-evaluation-harness model named ``specens`` (docs/scoring.md, "lm-eval").

``pipeline lm-eval`` is lm-eval's command line with ``specens`` registered beside the harness's own models. Its
``model_args``: ``models`` (names of the default config or ``NAME=SOURCE``) and a list ``gamma``, joined with ``+``
(lm-eval splits on commas); ``max_length``, the context window of log-likelihoods (default the first model's);
every other key is a method argument (``weights`` joined with ``+``). ``generate_until`` runs the decoder (over
the union of the members' vocabularies when they tokenize differently; such models refuse log-likelihoods);
``loglikelihood`` scores a continuation under the distribution the method's tokens are drawn from
(``target_distribution``) at temperature 1 without top-k or top-p; ``loglikelihood_rolling`` sums it over windows.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import lm_eval.models  # noqa: F401  (the harness's models: registering ours into an empty registry would hide them)
import torch
from lm_eval.api.model import TemplateLM
from lm_eval.api.registry import register_model
from tqdm import tqdm

from tasks.base import cut_at_stops

from ..decoding import Sampling, generate
from ..decoding.methods import parameter_counts, plan_method, restricted_heads
from ..decoding.spec import parse_method
from ..errors import ArgumentError, UserError
from ..models import decode_vocabulary, load_members, parse_model

IGNORED = {"batch_size", "max_batch_size", "device"}  # lm-eval passes these to every model
ROWS = 256  # positions combined at once (float64 rows over the vocabulary)


def _split(value: Any, cast=str) -> list:
    return [cast(v) for v in str(value).split("+") if v]


def _count(value: Any, floor: int) -> bool:
    text = str(value).strip()
    return not isinstance(value, bool) and text.isdigit() and int(text) >= floor


def check_model_args(models: Any, gamma: Any, seed: Any, max_gen_toks: Any, max_length: Any) -> None:
    """``model_args`` the model cannot run on, in one line naming the argument and what is accepted (lm-eval
    passes them as text, or as numbers it has converted)."""
    if not _split(models or ""):
        raise ArgumentError(
            f"model_args models={models!r}: expected model names or NAME=SOURCE joined with + (e.g. models=a+b)"
        )
    if not all(_count(g, 1) for g in str(gamma).split("+")):
        raise ArgumentError(f"model_args gamma={gamma!r}: expected an integer >= 1, or one per model joined with +")
    for name, value, floor in (("seed", seed, 0), ("max_gen_toks", max_gen_toks, 1)):
        if not _count(value, floor):
            raise ArgumentError(f"model_args {name}={value!r}: expected an integer >= {floor}")
    if max_length not in (None, "") and not _count(max_length, 1):
        raise ArgumentError(f"model_args max_length={max_length!r}: expected an integer >= 1")


def target_distribution(method: str, models: list, gamma: Any, method_args: dict[str, Any]):
    """The members (model indices) and target function of ``method``: what its tokens are drawn from."""
    plan, args = plan_method(method, parameter_counts(models), gamma, dict(method_args), restricted_heads(models))
    spec = parse_method(method)
    if spec.peer and spec.ensemble is not None:  # verified against the ensemble's distribution
        params = {k: v for k, v in args.items() if k in spec.ensemble.params}
        return list(range(len(models))), partial(spec.ensemble.fn, **params)
    return plan.members, plan.target_fn


def combine(target_fn, rows: list[torch.Tensor]) -> torch.Tensor:
    """Log-probabilities ``[n, V]`` under the target distribution of the members' logits rows (each ``[n, V]``,
    float64), at temperature 1 without top-k or top-p, ``ROWS`` positions at a time."""
    n = rows[0].shape[0]
    return torch.cat([target_fn([r[s : s + ROWS] for r in rows], Sampling.identity()).log() for s in range(0, n, ROWS)])


def score_continuation(logprobs: torch.Tensor, continuation: list[int]) -> tuple[float, bool]:
    """lm-eval's pair for one request: the continuation's summed log-probability, and whether it is greedy."""
    target = torch.tensor(continuation).unsqueeze(-1)
    return float(logprobs.gather(-1, target).sum()), bool((logprobs.argmax(dim=-1) == target.squeeze(-1)).all())


def continuation_logprobs(
    models: list, members: list[int], target_fn, tokens: list[int], n: int, vocab: int | None = None
) -> torch.Tensor:
    """Log-probabilities ``[n, V]`` of the last ``n`` positions of ``tokens`` under the target distribution.

    One forward per member over ``tokens[:-1]``, keeping the ``n`` rows that predict ``tokens[-n:]``; ``vocab``:
    the rows kept of each head (``models.token_rows``: padded heads cropped to the shared tokenizer).
    """
    rows = []
    with torch.inference_mode():
        for i in members:
            model = models[i]
            device = next(model.parameters()).device
            ids = torch.tensor([tokens[:-1]], device=device)
            logits = model(input_ids=ids, use_cache=False, logits_to_keep=n).logits[0, -n:, :vocab]
            rows.append(logits.to("cpu", torch.float64))
        return combine(target_fn, rows)


@register_model("specens")
class SpecEnsLM(TemplateLM):
    def __init__(
        self,
        models: str = "",  # required: refused in one line when missing (check_model_args)
        method: str = "large_model",
        gamma: Any = 1,
        seed: int = 0,
        max_gen_toks: int = 256,
        max_length: int | None = None,
        **kwargs: Any,
    ):
        super().__init__()
        check_model_args(models, gamma, seed, max_gen_toks, max_length)
        specs = [parse_model(m) for m in _split(models)]
        self.models, tokenizers = load_members(specs)
        self.tokenizer = tokenizers[0]  # contexts: the first model's tokens
        self.vocabulary = decode_vocabulary(self.models, tokenizers)  # a union, or padded heads cropped
        self.union = self.vocabulary.get("tokenizers")
        self.names = [s.name for s in specs]
        self.method = method
        self.gamma = _split(gamma, int) if "+" in str(gamma) else int(gamma)
        self.seed = seed
        self.max_gen_toks = max_gen_toks
        self.method_args = {k: v for k, v in kwargs.items() if k not in IGNORED}
        if "weights" in self.method_args:
            self.method_args["weights"] = _split(self.method_args["weights"], float)
        self.members, self.target_fn = None, None  # different tokenizers: no log-likelihoods (see below)
        if self.union is None:
            self.members, self.target_fn = target_distribution(method, self.models, self.gamma, self.method_args)
        self._max_length = int(max_length) if max_length else None

    @property
    def eot_token_id(self) -> int:
        return self.tokenizer.eos_token_id

    @property
    def prefix_token_id(self) -> int:
        """The token an empty context is replaced by: BOS, else EOS (as lm-eval's ``hf`` model)."""
        bos = self.tokenizer.bos_token_id
        return bos if bos is not None else self.tokenizer.eos_token_id

    @property
    def max_length(self) -> int:
        """The context window for log-likelihoods: ``max_length``, else the first model's (as ``hf`` reads it)."""
        from lm_eval.models.utils import resolve_max_length

        return self._max_length or resolve_max_length(self.models[0].config, self.tokenizer)

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kwargs: Any) -> list[int]:
        special = {} if add_special_tokens is None else {"add_special_tokens": add_special_tokens}
        return self.tokenizer.encode(string, **special)

    def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, **kwargs: Any) -> list[tuple[float, bool]]:
        if self.union is not None:
            raise UserError(
                f"models {' + '.join(self.names)} have different tokenizers: log-likelihoods of a continuation are "
                "defined over one shared tokenization, so loglikelihood tasks need one; generate_until tasks run"
            )
        out = []
        last = None, None  # (input, rows) -> log-probs: the choices of one question share their forwards
        for key, context, continuation in tqdm(requests, disable=disable_tqdm, desc="specens loglikelihood"):
            n = len(continuation)
            if not 0 < n <= self.max_length:
                raise UserError(f"a continuation of {n} tokens: expected 1 to max_length={self.max_length}")
            tokens = (context + continuation)[-(self.max_length + 1) :]  # the window, cut from the left
            if last[0] != (tokens[:-1], n):
                last = (
                    (tokens[:-1], n),
                    continuation_logprobs(
                        self.models, self.members, self.target_fn, tokens, n, self.vocabulary.get("vocab_size")
                    ),
                )
            result = score_continuation(last[1], continuation)
            out.append(result)
            if key is not None:
                self.cache_hook.add_partial("loglikelihood", key, result)
        return out

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        from lm_eval.utils import get_rolling_token_windows, make_disjoint_window

        out = []
        for (string,) in tqdm([r.args for r in requests], disable=disable_tqdm, desc="specens rolling"):
            windows = get_rolling_token_windows(
                token_list=self.tok_encode(string),
                prefix_token=self.prefix_token_id,
                max_seq_len=self.max_length,
                context_len=1,
            )
            pairs = [(None, *make_disjoint_window(w)) for w in windows]
            total = sum(ll for ll, _ in self._loglikelihood_tokens(pairs, disable_tqdm=True))
            out.append(total)
            self.cache_hook.add_partial("loglikelihood_rolling", (string,), total)
        return out

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        out = []
        for i, request in enumerate(tqdm(requests, disable=disable_tqdm, desc="specens")):
            context, gen_kwargs = request.args
            until = gen_kwargs.get("until") or []
            until = [until] if isinstance(until, str) else list(until)
            result = generate(
                self.models,
                self.tokenizer(context).input_ids,
                self.method,
                gamma=self.gamma,
                max_new_tokens=int(gen_kwargs.get("max_gen_toks", self.max_gen_toks)),
                temperature=float(gen_kwargs.get("temperature", 1.0)) if gen_kwargs.get("do_sample", False) else 0.0,
                top_p=float(gen_kwargs.get("top_p", 1.0)),
                top_k=int(gen_kwargs.get("top_k", 0) or 0),
                method_args=self.method_args,
                seed=self.seed + i,
                eos_token_id=self.tokenizer.eos_token_id,
                stop_strings=until,
                tokenizer=self.tokenizer,
                **self.vocabulary,
            )
            out.append(cut_at_stops(result.text, until))
        return out
