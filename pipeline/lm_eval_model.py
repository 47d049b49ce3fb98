"""The shared decoder as an lm-evaluation-harness model named ``specens``.

lm-eval's own ``lm_eval`` command imports no plugins, so run it through
``pipeline lm-eval`` (same arguments), which registers the model first::

    pipeline lm-eval --model specens \\
        --model_args method=we_se,models=smollm2-135m-instruct+smollm2-draft-l1,gamma=1+4,lambda=0.5 \\
        --tasks gsm8k_local --include_path tasks/lm_eval --limit 5

``models`` and a list ``gamma`` are joined with ``+`` (lm-eval splits
``model_args`` on commas). Every other key is a method argument (``lambda``,
``weights`` joined with ``+``, ``alpha``, ``beta``, ``proposer``,
``first_proposer``). Only ``generate_until`` is offered: the decoder
generates, it does not score log-likelihoods.
"""

from __future__ import annotations

from typing import Any

from lm_eval.api.model import LM
from lm_eval.api.registry import register_model
from tqdm import tqdm

from tasks.base import cut_at_stops

from .decoding import generate
from .models import load_set, parse_model

IGNORED = {"batch_size", "max_batch_size", "device"}  # lm-eval passes these to every model


def _split(value: Any, cast=str) -> list:
    return [cast(v) for v in str(value).split("+") if v]


@register_model("specens")
class SpecEnsLM(LM):
    def __init__(
        self,
        models: str,
        method: str = "large_model",
        gamma: Any = 1,
        seed: int = 0,
        max_gen_toks: int = 256,
        **kwargs: Any,
    ):
        super().__init__()
        self.models, self.tokenizer = load_set([parse_model(m) for m in _split(models)])
        self.method = method
        self.gamma = _split(gamma, int) if "+" in str(gamma) else int(gamma)
        self.seed = seed
        self.max_gen_toks = max_gen_toks
        self.method_args = {k: v for k, v in kwargs.items() if k not in IGNORED}
        if "weights" in self.method_args:
            self.method_args["weights"] = _split(self.method_args["weights"], float)

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
            )
            out.append(cut_at_stops(result.text, until))
        return out

    def loglikelihood(self, requests):
        raise NotImplementedError("specens generates; choose generate_until tasks (e.g. gsm8k_local)")

    loglikelihood_rolling = loglikelihood


def main(argv: list[str] | None = None) -> int:
    """Run lm-eval's command line with the ``specens`` model registered."""
    import sys

    from lm_eval.__main__ import cli_evaluate

    sys.argv = ["lm_eval", *(argv if argv is not None else sys.argv[1:])]
    cli_evaluate()
    return 0
