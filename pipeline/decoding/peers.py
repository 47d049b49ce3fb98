"""Peers: transformers' own speculative methods, run as grid methods beside ours.

``hf_assisted`` is transformers' assisted generation (``assistant_model``, a
constant ``num_assistant_tokens = gamma``, no confidence stop),
``hf_prompt_lookup`` its prompt lookup (``prompt_lookup_num_tokens =
gamma``), ``hf_assisted_ensemble`` assisted generation verified against
``w p + (1 - w) q`` (``assistant_ensemble_weight = w``, our ``we`` with
``lambda = 1 - w``). After a fully accepted block transformers draws the next
token from the target ``p`` alone, not from the mixture, so that method's
output is not the weighted ensemble's distribution (``tests/test_peers.py``
measures the gap).

Each call is seeded (``torch.manual_seed``: transformers samples with the
global generator) and takes our temperature, top-k, top-p and EOS ids; our stop
rule (``member.Stopper``) is its stopping criterion, checked after each block,
and its output is cut where that rule stops (``cut_at_stop``), so both sides count the
same tokens. Recorded is what can be counted from outside: wall time and each
model's forwards (``_Counter``); proposals, verifications and acceptances are
not (left at 0; ``rounds`` and ``accepted`` are None).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import torch

from .member import Stopper
from .sampling import Sampling
from .spec import DRAFT, MethodSpec
from .stats import GenerationStats, ModelStats


class _Counter:
    """Forward hooks on one model: calls, tokens fed and time inside ``forward``."""

    def __init__(self, model: torch.nn.Module, stats: ModelStats):
        self.stats, self.start = stats, 0.0
        self.sync = next(model.parameters()).device.type == "cuda"
        self.handles = [
            model.register_forward_pre_hook(self._pre, with_kwargs=True),
            model.register_forward_hook(self._post, with_kwargs=True),
        ]

    def _pre(self, module, args, kwargs):
        self.start = time.perf_counter()

    def _post(self, module, args, kwargs, output):
        if self.sync:
            torch.cuda.synchronize()
        ids = kwargs.get("input_ids", args[0] if args else None)
        self.stats.forward_time_s += time.perf_counter() - self.start
        self.stats.forward_calls += 1
        self.stats.forwarded_tokens += int(ids.shape[-1]) if ids is not None else 0

    def remove(self) -> None:
        for h in self.handles:
            h.remove()


def _stop_criterion():
    from transformers import StoppingCriteria

    class OurStop(StoppingCriteria):
        """Our stop rule (``member.Stopper``) as transformers' stopping criterion, checked after each block."""

        def __init__(self, stopper: Stopper, prompt_len: int):
            self.stopper, self.prompt_len, self.checked = stopper, prompt_len, prompt_len

        def __call__(self, input_ids, scores, **kwargs):
            tokens = input_ids[0].tolist()
            ends = range(self.checked + 1, len(tokens) + 1)
            stop = any(self.stopper.reason(tokens, self.prompt_len, end) for end in ends)
            self.checked = len(tokens)
            return torch.full((input_ids.shape[0],), stop, dtype=torch.bool, device=input_ids.device)

    return OurStop


def generation_config(
    spec: MethodSpec, args: dict[str, Any], sampling: Sampling, max_new_tokens: int, eos: set[int]
) -> Any:
    """transformers' ``GenerationConfig`` for a peer: every sampling value given, none left to a model's defaults."""
    from transformers import GenerationConfig

    eos_ids = sorted(eos)
    warp = {"temperature": sampling.temperature, "top_k": sampling.top_k, "top_p": sampling.top_p}  # top_k 0: off
    config = GenerationConfig(
        max_new_tokens=max_new_tokens,
        do_sample=not sampling.greedy,
        **({} if sampling.greedy else warp),  # greedy: never warped, as ours
        eos_token_id=eos_ids,
        pad_token_id=eos_ids[0] if eos_ids else 0,
    )
    if spec.peer_proposer != DRAFT:  # with a draft, gamma is the assistant's own setting (``run_peer``)
        config.prompt_lookup_num_tokens = args["gamma"]
    if spec.ensemble is not None:
        config.assistant_ensemble_weight = args["weights"][0]  # w on the target: our lambda is 1 - w
    return config


def run_peer(
    spec: MethodSpec,
    models: Sequence[torch.nn.Module],
    prompt: list[int],
    args: dict[str, Any],
    sampling: Sampling,
    stopper: Stopper,
    seed: int,
) -> tuple[list[int], GenerationStats]:
    """Run a peer method on ``prompt``; return its new tokens (cut by ``stopper``) and its stats."""
    target = models[0]
    device = next(target.parameters()).device
    stats = GenerationStats(method=spec.name, prompt_tokens=len(prompt), rounds=None, accepted=None)
    stats.models = [ModelStats() for _ in models]
    used = [0, 1] if spec.peer_proposer == DRAFT else [0]
    if stopper.max_new_tokens == 0:  # transformers refuses to generate nothing; ours returns at once
        stats.stop_reason = "max_new_tokens"
        return [], stats
    config = generation_config(spec, args, sampling, stopper.max_new_tokens, stopper.eos_ids)
    kwargs: dict[str, Any] = {}
    if spec.peer_proposer == DRAFT:  # the draft proposes a constant gamma (transformers reads it from the assistant)
        kwargs["assistant_model"] = draft = models[1]
        draft.generation_config.num_assistant_tokens = args["gamma"]
        draft.generation_config.num_assistant_tokens_schedule = "constant"
        draft.generation_config.assistant_confidence_threshold = 0.0
    if stopper.stop_strings:  # our rule after each block (transformers' own stop strings fail in the assistant)
        from transformers import StoppingCriteriaList

        kwargs["stopping_criteria"] = StoppingCriteriaList([_stop_criterion()(stopper, len(prompt))])
    ids = torch.tensor([prompt], dtype=torch.long, device=device)
    counters = [_Counter(models[i], stats.models[i]) for i in used]
    try:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        torch.manual_seed(seed)
        start = time.perf_counter()
        with torch.inference_mode():
            out = target.generate(ids, attention_mask=torch.ones_like(ids), generation_config=config, **kwargs)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        stats.wall_time_s = time.perf_counter() - start
    finally:
        for c in counters:
            c.remove()
    tokens = out[0, len(prompt) :].tolist()
    tokens, stats.stop_reason = cut_at_stop(tokens, prompt, stopper)
    stats.new_tokens = len(tokens)
    return tokens, stats


def cut_at_stop(
    tokens: list[int], prompt: list[int], stopper: Stopper, engine: str = "transformers"
) -> tuple[list[int], str]:
    """Another engine's ``tokens`` up to where our stop rule stops, and why (``engine`` where it stopped first)."""
    full = prompt + tokens
    for end in range(len(prompt) + 1, len(full) + 1):
        reason = stopper.reason(full, len(prompt), end)
        if reason is not None:
            return tokens[: end - len(prompt)], reason
    return tokens, "max_new_tokens" if not tokens or len(tokens) >= stopper.max_new_tokens else engine
