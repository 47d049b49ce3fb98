"""The feature-level proposer ``eagle`` (the EAGLE family): it drafts through a feature head attached to a model
of the set, from that model's own last hidden states, which its verification forwards compute anyway.

The head (``pipeline/models/feature_head.py``, attached by ``attach``) maps (f_t, x_{t+1}) to f_{t+1}: the target's
feature at position t (before its final norm for this project's heads, after it for EAGLE's layout, three of its
layers' inputs fused by the head's ``fc`` for EAGLE-3's: ``LAYOUTS``) and the next token, to the next feature, whose
logits give the token after. Where the target has computed f_t
(positions it has run, read by a hook on its final norm) the head
takes the true feature; beyond, its own prediction. Its inputs are kept between rounds in its own KV cache and
recomputed from the first that changed, or that used a prediction where the true feature has since come. It is
a proposer like any other: its token is drawn from its own distribution q (argmax when greedy) and the shared
acceptance rule keeps every method exact (docs/algorithms.md).
"""

from __future__ import annotations

import time

import torch
from torch import Tensor

from ...errors import ArgumentError
from ..runner import HFRunner
from ..sampling import Sampling, probs, sample
from ..stats import ModelStats
from .base import NamedProposer, Proposal, ProposerSetup, register_proposer

FEATURE_HEAD = "_specens_feature_head"  # where a model keeps its attached head (its __dict__)


def attach(model: torch.nn.Module, head: torch.nn.Module) -> torch.nn.Module:
    """Make ``head`` (a ``models.feature_head.FeatureHead`` for ``model``) the head the ``eagle`` proposer uses."""
    model.__dict__[FEATURE_HEAD] = head
    return model


def attached(model: torch.nn.Module | None) -> torch.nn.Module | None:
    return None if model is None else model.__dict__.get(FEATURE_HEAD)


# where a head reads the target's features (``FeatureHead.layout``): this project's heads before its final norm,
# EAGLE's published checkpoints (as vLLM runs them) after it, EAGLE-3's the inputs of three of its layers
# (``models/eagle3.py``), which the head fuses into one feature
LAYOUTS = {
    "ours": "before the final norm",
    "eagle": "after the final norm",
    "eagle3": "the inputs of three decoder layers (low, middle, high), fused by the head",
}


class Hooks:
    """The handles of the hooks that read a forward's features: ``.remove()`` stops them all."""

    def __init__(self, handles):
        self.handles = list(handles)

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()


def read_features(model: torch.nn.Module, head, found) -> Hooks:
    """Call ``found(hidden)`` (``[batch, n, d]``, EAGLE-3's ``[batch, n, 3d]``: its layers' inputs side by side in
    layer order) with the features ``head`` reads (its ``layout``, or a layout's name), on each forward of
    ``model``'s decoder; returns the hooks (``.remove()`` stops them)."""
    layout = head if isinstance(head, str) else head.layout
    norm = model.model.norm
    if layout == "eagle":
        return Hooks([norm.register_forward_hook(lambda _m, _args, out: found(out))])
    if layout != "eagle3":
        return Hooks([norm.register_forward_pre_hook(lambda _m, args: found(args[0]))])
    layers, inputs = head.aux_layers, {}

    def read(index: int):
        def hook(_module, args, kwargs):
            inputs[index] = args[0] if args else kwargs["hidden_states"]
            if index == layers[-1]:  # the last of the three: one forward's features, side by side (on one device)
                last = inputs[index]
                found(torch.cat([inputs.pop(i).to(last.device) for i in layers], dim=-1))

        return hook

    return Hooks(model.model.layers[i].register_forward_pre_hook(read(i), with_kwargs=True) for i in layers)


@register_proposer("eagle")
class FeatureProposer(NamedProposer):
    branches = True  # a distribution per node (``logits``): EAGLE-2's dynamic trees grow by it
    reads_features = True  # the first model's features, through its head (``attach``)

    def __init__(self, runner: HFRunner, head, sampling: Sampling, generator: torch.Generator | None):
        self.runner, self.head, self.sampling, self.generator = runner, head, sampling, generator
        self.stats = ModelStats()
        self.features: Tensor | None = None  # [capacity, d]: the target's features, by position
        self.cache = head.new_cache()
        self.inputs: list[tuple[int, bool]] = []  # per head input t: (the token x_{t+1}, whether f_t was true)
        self.outputs: list[Tensor] = []  # per head input t: its predicted f_{t+1}
        self.true_at: dict[int, int] = {}  # per drafted position: how many true features it was drafted from
        self._reading = True
        self._hook = read_features(runner.model, head, self._capture)
        runner.followers.append(self)  # a token tree's compaction moves the features with the cache (tree/cache.py)

    @classmethod
    def for_decoder(cls, setup: ProposerSetup) -> FeatureProposer:
        """The proposer of the first member with an attached head; one line when none has one or it cannot run."""
        sampling, generator = setup.sampling, setup.generator
        for member in setup.members:
            head = attached(getattr(member.runner, "model", None))
            if head is None:
                continue
            if type(member.runner) is not HFRunner:
                raise ArgumentError(
                    "proposer 'eagle' reads its model's features from the eager runner's forwards: load the model "
                    "with runner eager (one tokenizer for the set)"
                )
            return cls(member.runner, head, sampling, generator)
        raise ArgumentError(
            "proposer 'eagle' needs a feature head attached to a model of the set "
            "(pipeline.models.head_files.load_head, or a model's eagle entry in a config)"
        )

    def close(self) -> None:
        """Stop reading the model's features (the generation is over)."""
        self._hook.remove()
        if self in self.runner.followers:
            self.runner.followers.remove(self)

    def compact(self, start: int, keep: list[int]) -> None:
        """The runner moved the cache slots ``keep`` to ``start, start+1, ...`` (a token tree's accepted path):
        the features captured at those slots move with them."""
        if self.features is not None and keep:
            self.features[start : start + len(keep)] = self.features[keep].clone()

    def _capture(self, hidden: Tensor) -> None:
        if not self._reading:
            return
        hidden = hidden[0]  # as read: EAGLE-3's three layers are fused when drafted from (its time, not the target's)
        start, k = self.runner.length, hidden.shape[0]  # the runner counts these tokens once its forward returns
        if self.features is None or self.features.shape[0] < start + k:
            grown = hidden.new_zeros((max(2 * (start + k), 256), hidden.shape[1]))
            if self.features is not None:
                grown[: self.features.shape[0]] = self.features
            self.features = grown
        self.features[start : start + k] = hidden

    def feed(self, tokens: list[int], committed: int) -> None:
        """Nothing to feed: the head catches up when it drafts."""

    def draft(self, tokens: list[int], committed: int) -> Proposal | None:
        row = self.logits(tokens)
        if row is None:
            return None
        if self.sampling.greedy:
            return Proposal(int(row.argmax()), None, self)
        q = probs(row[None], self.sampling)
        return Proposal(int(sample(q, self.generator)[0]), q[0], self)

    def logits(self, context: list[int]) -> Tensor | None:
        """The head's logits row for the token after ``context`` (None: the target has computed no feature yet);
        a token tree draws a node's children from it (``tree/draft.py``), as EAGLE-2 does."""
        pos = len(context)
        start = time.perf_counter()
        feature = self._advance(context, pos - 2) if pos >= 2 else None
        if feature is None:  # no feature yet (the target has not run): nothing to draft from
            return None
        self.true_at[pos] = min(self.runner.length, pos - 1)
        row = self.head.logits(feature)[: self.runner.vocab_size].to(self.runner.out_device)  # as the target's rows
        if self.runner.sync:  # on a GPU: the head's kernels finished, so that forward_time_s times them
            torch.cuda.synchronize(self.runner.device)
        self.stats.forward_time_s += time.perf_counter() - start
        self.stats.forward_calls += 1
        return row

    def _advance(self, tokens: list[int], last: int) -> Tensor | None:
        """The head's predicted f_{last+1} after its inputs 0..``last`` agree with ``tokens`` (None: no feature)."""
        true = self.runner.length  # positions whose true feature the target has computed
        keep = 0
        for t, (token, was_true) in enumerate(self.inputs[: last + 1]):
            if tokens[t + 1] != token or (not was_true and t < true):
                break
            keep = t + 1
        if keep < len(self.inputs):
            if keep:
                self.cache.crop(keep - len(self.inputs))  # a negative count removes that many inputs
            else:
                self.cache = self.head.new_cache()
            del self.inputs[keep:], self.outputs[keep:]
        t = keep
        if t < min(last + 1, true):  # inputs with true features: one forward
            stop = min(last + 1, true)
            out = self._step(self.fuse(self.features[t:stop]), tokens[t + 1 : stop + 1], t)
            self.inputs += [(x, True) for x in tokens[t + 1 : stop + 1]]
            self.outputs += list(out)
            t = stop
        while t <= last:  # beyond: one input at a time, each from the prediction before it
            if t == 0:
                return None
            out = self._step(self.outputs[t - 1][None], tokens[t + 1 : t + 2], t)
            self.inputs.append((tokens[t + 1], False))
            self.outputs.append(out[0])
            t += 1
        return self.outputs[last]

    def recompute(self, tokens: list[int], pos: int) -> Tensor:
        """The logits row its proposal at ``pos`` was drawn from, recomputed from scratch (the audit,
        ``audit.py``): the target's features from one forward without a cache, the head without its cache."""
        true = self.true_at[pos]
        self._reading = False
        try:
            found: list[Tensor] = []
            hook = read_features(self.runner.model, self.head, lambda hidden: found.append(self.fuse(hidden[0])))
            try:
                self.runner.model(input_ids=torch.tensor([tokens[:true]], device=self.runner.device), use_cache=False)
            finally:
                hook.remove()
        finally:
            self._reading = True
        features = list(found[0])
        for t in range(true, pos - 1):  # the predicted features, each from the whole sequence before it, no cache
            features.append(self.head.step(torch.stack(features[:t]), torch.tensor(tokens[1 : t + 1]), None, 0)[-1])
        out = self.head.step(torch.stack(features[: pos - 1]), torch.tensor(tokens[1:pos]), None, 0)[-1]
        return self.head.logits(out)[: self.runner.vocab_size]

    def fuse(self, hidden: Tensor) -> Tensor:
        """The target's features as the head drafts from them (EAGLE-3's: its three layers' inputs through ``fc``)."""
        return self.head.fuse(hidden)

    def _step(self, features: Tensor, tokens: list[int], start: int) -> Tensor:
        ids = torch.tensor(tokens, dtype=torch.long)
        self.stats.forward_calls += 1
        self.stats.forwarded_tokens += len(tokens)
        return self.head.step(features, ids, self.cache, start)
