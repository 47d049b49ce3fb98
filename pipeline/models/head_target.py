"""What a feature head learns to draft: its own model's next token (the default), or an ensemble's.

A head for an ensemble (a head recipe's ``target``: ``{method, members, method_args}``) reads its model's features
as any head does, and is trained on the next-token distribution of the ensemble it will propose for: the method's
own ensemble function (``decoding/ensembles/``, through ``decoding.methods.plan_method``) over the members' logits,
its model first and the ``members`` after it in the method's order, with the method's arguments, at temperature 1
(``Sampling.identity``: the distribution a greedy target is the argmax of). The teacher data is the model's own
(``teacher.teacher_data``); only the distribution each labelled row is trained on, and the held-out rows it is
measured on, are the ensemble's (``for_ensemble``).

Whatever a head was trained on, the method's acceptance rule verifies its proposals against the method's own
target distribution (docs/algorithms.md): the target moves acceptance, never the output.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from ..decoding.runner import as_rows
from .spec import ModelError, ModelSpec, spec_of
from .teacher import Example, TeacherData

TARGET_KEYS = ("method", "members", "method_args")
MAX_MEMBERS = 8  # each one loaded and run over every training sequence
ACCEPTED = "'model', or {method: an ensemble method such as we or cd, members: [the other models], method_args: {...}}"


@dataclass(frozen=True)
class EnsembleTarget:
    """The ensemble a head is trained for: a plain ensemble method, the other members (after the head's own
    model, in the method's order; names or spec dicts) and the method's arguments."""

    method: str
    members: tuple[Any, ...]
    method_args: dict[str, Any]

    def label(self) -> str:
        """``we(+smollm2-draft-l2, lambda=0.5)``: the method, the other members and the arguments."""
        names = [m if isinstance(m, str) else m.get("name", "?") for m in self.members]
        args = ", ".join(f"{k}={v}" for k, v in sorted(self.method_args.items()))
        return f"{self.method}(+{'+'.join(names)}{', ' + args if args else ''})"


def ensemble_target(value: Any, what: str = "feature head") -> EnsembleTarget | None:
    """A recipe's ``target``: None for ``model`` (the head's own model), else the ensemble, checked as far as it
    can be without the models (the method and its arguments for that many members); one line where it cannot."""
    from ..decoding.methods import plan_method
    from ..decoding.spec import parse_method
    from ..errors import ArgumentError

    if value is None or value == "model":
        return None
    if not isinstance(value, dict):
        raise ModelError(f"{what} target={value!r}: accepted: {ACCEPTED}")
    unknown = sorted(set(value) - set(TARGET_KEYS), key=str)
    if unknown:
        raise ModelError(f"{what} target: unknown key {unknown[0]!r}; accepted: {', '.join(TARGET_KEYS)}")
    method, members, args = value.get("method"), value.get("members"), value.get("method_args") or {}
    try:
        spec = parse_method(method) if isinstance(method, str) else None
    except ArgumentError:
        spec = None
    if spec is None or spec.ensemble is None or spec.speculative or spec.peer or spec.engine.elsewhere:
        raise ModelError(f"{what} target method={method!r}: expected an ensemble method (we, cd, gac, ...)")
    if not isinstance(members, list | tuple) or not members or not all(isinstance(m, str | dict) for m in members):
        raise ModelError(f"{what} target members={members!r}: expected a list of the other models' names")
    if len(members) > MAX_MEMBERS:
        raise ModelError(f"{what} target members: {len(members)} models; accepted: 1 to {MAX_MEMBERS}")
    if not isinstance(args, dict):
        raise ModelError(f"{what} target method_args={args!r}: expected a mapping")
    try:
        plan_method(spec, [1] * (1 + len(members)), None, dict(args))
    except ArgumentError as err:
        raise ModelError(f"{what} target: {err}") from None
    return EnsembleTarget(method, tuple(members), dict(args))


def member_spec(member: Any) -> ModelSpec:
    """A member of an ensemble target as a spec: a model name (resolved like any model) or a full spec dict."""
    return spec_of(member, f"ensemble member {member.get('name') if isinstance(member, dict) else member!r}")


def distribution(target: EnsembleTarget, models: Sequence[torch.nn.Module]) -> Callable[[list[Tensor]], Tensor]:
    """The ensemble's next-token distribution from its members' logits rows (``[k, V]`` each, the head's model
    first): the method's own target function at temperature 1; one line where the models cannot run it."""
    from ..decoding.methods import parameter_counts, plan_method
    from ..decoding.sampling import Sampling
    from ..errors import ArgumentError

    restricted = [str(i) for i, m in enumerate(models) if getattr(m, "restricted_vocab", False)]
    try:
        plan, _ = plan_method(target.method, parameter_counts(models), None, dict(target.method_args), restricted)
    except ArgumentError as err:
        raise ModelError(f"feature head target {target.label()}: {err}") from None
    sampling = Sampling.identity()
    return lambda rows: plan.target_fn([as_rows(r, r.device) for r in rows], sampling)


@torch.inference_mode()
def rows_of(models: Sequence[torch.nn.Module], ids: Tensor, rows: Tensor) -> list[Tensor]:
    """Each model's logits at ``rows`` of one ``[1, n]`` sequence (teacher forcing)."""
    cpu = torch.device("cpu")
    return [as_rows(m(input_ids=ids.to(next(m.parameters()).device)).logits[0, rows], cpu) for m in models]


def log_of(probs: Tensor) -> Tensor:
    """``log probs`` with zeros at the smallest normal number's log, so a loss weighing them by probability 0
    stays finite (an ensemble such as ``cd`` puts exactly 0 outside its plausible set)."""
    return probs.clamp_min(torch.finfo(probs.dtype).tiny).log()


@torch.inference_mode()
def for_ensemble(data: TeacherData, models: Sequence[torch.nn.Module], dist: Callable[[list[Tensor]], Tensor]):
    """``data`` with every labelled row's distribution (over the kept ids) and argmax label, and every held-out
    row's distribution (over the whole vocabulary), the ensemble's: ``dist`` of the members' logits there."""
    kept = torch.tensor(data.kept)
    index = torch.full((int(models[0].get_output_embeddings().weight.shape[0]),), -100, dtype=torch.long)
    index[kept] = torch.arange(len(kept))
    examples = []
    for e in data.examples:
        r = dist(rows_of(models, e.ids, e.rows))
        labels = e.labels.clone()
        labels[e.rows] = index[r.argmax(-1)]
        examples.append(Example(e.ids, labels, e.rows, log_of(r[:, kept])))
    held = []
    for prompt, cont, _ in data.held:
        if not cont or not prompt:
            continue
        ids = torch.tensor([prompt + cont])
        rows = torch.arange(len(prompt) - 1, len(prompt) + len(cont) - 1)
        held.append((prompt, cont, log_of(dist(rows_of(models, ids, rows)))))
    return TeacherData(examples, data.kept, data.label_coverage, held, data.seconds)
