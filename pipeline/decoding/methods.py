"""A method's plan (target models, schedule of proposers) and the public ``generate`` (its argument checks:
``checks.py``)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import torch

from ..errors import ArgumentError
from .audit import Audit
from .checks import (
    check_context,
    check_gamma,
    check_gamma_schedule,
    check_loaded,
    check_sampling,
    check_seed,
    check_vocab_size,
    eos_set,
    head_rows,
    model_name,
    prompt_list,
)
from .corpus import CorpusView
from .ensembles import single_model
from .joined import Joined, join
from .loop import Decoder
from .member import Member, Stopper
from .parallel import ConcurrentForwards
from .peers import run_peer
from .proposers import (
    NAMED_PROPOSERS,
    Chain,
    ModelProposer,
    Proposer,
    ProposerKind,
    ProposerSetup,
    build,
    capabilities,
    close,
    parse_proposer,
    parts,
    tree_proposer_problem,
)
from .spec import MethodSpec, is_int, parse_method
from .static import make_runner
from .stats import GenerationStats, ModelStats
from .tree.loop import check_tree_models, parse_tree, tree_loop
from .tree.shape import mixed_tokenizers_problem

Turn = tuple[tuple[str | int, ...], int]  # (proposers, chained: names or model indices; gamma)


@dataclass
class GenerationResult:
    token_ids: list[int]
    stats: GenerationStats
    text: str | None = None
    method_args: dict[str, Any] = field(default_factory=dict)  # the arguments as resolved (defaults filled)
    pieces: list[str] | None = None  # models with different tokenizers: the union tokens emitted, as text


@dataclass(frozen=True)
class Plan:
    """What a method runs: target members, target function, schedule of turns (None: autoregressive),
    and for a mixture method the members' weights (one member drawn per position)."""

    members: list[int]
    target_fn: Callable
    schedule: list[Turn] | None
    concurrent: bool = False  # the autoregressive loop runs the members' forwards concurrently
    mixture: list[float] | None = None


def parameter_counts(models: Sequence[torch.nn.Module]) -> list[int]:
    return [sum(p.numel() for p in m.parameters()) for m in models]


def restricted_heads(models: Sequence[torch.nn.Module]) -> list[str]:
    """The models whose output head covers part of the vocabulary (distilled drafts), by index."""
    return [str(i) for i, m in enumerate(models) if getattr(m, "restricted_vocab", False)]


def fixed_turns(schedule: list[Turn] | None, sizes: Sequence[int]) -> frozenset[int]:
    """Turns that keep their gamma under a dynamic schedule: the largest model's (in a set of two or more).

    Each token the largest model drafts costs one of its own forwards, so a longer draft from it saves
    no forward of the largest model and wastes every one after a rejection.
    """
    if not schedule or len(sizes) < 2:
        return frozenset()
    keep = max(range(len(sizes)), key=lambda i: (sizes[i], -i))  # the most parameters (the earlier one on a tie)
    return frozenset(k for k, (turn, _) in enumerate(schedule) if keep in turn)


def plan_method(
    method: str | MethodSpec,
    sizes: Sequence[int],
    gamma: Any,
    method_args: dict[str, Any],
    restricted: Sequence[str] = (),
) -> tuple[Plan, dict[str, Any]]:
    """Check a method (its name, or its spec parsed already) and its arguments against a model set (``sizes``:
    each model's parameter count; ``restricted``: the models with a restricted output head); return its plan and
    resolved args."""
    spec = method if isinstance(method, MethodSpec) else parse_method(method)
    if spec.engine.elsewhere:
        raise ArgumentError(
            f"{spec.name!r} runs {spec.engine.elsewhere}; this decoder runs our methods and transformers' own (hf_*)"
        )
    n = len(sizes)
    args = spec.check(n, method_args, restricted)
    if spec.peer:  # transformers' own generate (peers.py): no plan of ours
        args["gamma"] = check_gamma(spec, gamma, n)[-1]
        return Plan([0], single_model, None), args
    if spec.ensemble is None:
        target = [0 if spec.base == "large_model" else n - 1]
        if not spec.speculative:
            return Plan(target, single_model, None), args
        args["gamma"] = check_gamma(spec, gamma, n)[-1]
        kind = parse_proposer(args["proposer"])
        return Plan(target, single_model, _schedule(kind, target, [1], [args["gamma"]])), args
    target_fn = partial(spec.ensemble.fn, **{k: v for k, v in args.items() if k in spec.ensemble.params})
    members = list(range(n))
    if not spec.speculative:
        return Plan(members, target_fn, None, spec.parallel, args["weights"] if spec.mixture else None), args
    if args["first_proposer"] is None:  # the fewest parameters (the later one on a tie)
        args["first_proposer"] = max(range(n), key=lambda i: (-sizes[i], i))
    first = args["first_proposer"]
    gammas = args["gamma"] = check_gamma(spec, gamma, n)
    if spec.mixture:
        args["gamma"] = gammas[first]
        return Plan(members, target_fn, [((first,), gammas[first])], mixture=args["weights"]), args
    order = members[first:] + members[:first] if spec.in_turn else [first]
    kind = parse_proposer(args["proposer"])
    return Plan(members, target_fn, _schedule(kind, members, order, [gammas[i] for i in order])), args


def _schedule(kind: ProposerKind, targets: list[int], drafters: list[int], gammas: list[int]) -> list[Turn]:
    """The turns of a speculative method (see ``loop.py``): ``drafters`` propose in turn, ``gammas``
    tokens each; the other target models only verify. Without ``draft`` in the proposer kind no model
    drafts: one turn proposes the first drafter's gamma, then every target model verifies."""
    named = kind.named
    if not kind.draft:
        return [(named, gammas[0])] + [((i,), 0) for i in targets]
    turns: list[Turn] = [((*named, i), g) for i, g in zip(drafters, gammas)]
    return turns + [((i,), 0) for i in targets if i not in drafters]


def _proposers(
    schedule: list[Turn],
    members: list[Member],
    setup: ProposerSetup,
    stats: GenerationStats,
    audit: Audit | None,
    tree: bool = False,
) -> tuple[list[tuple[Proposer, int]], list[Proposer]]:
    """The schedule's proposers, and those of them that watch the target's verified rows (``NamedProposer``'s
    ``watches``): one instance of each named proposer, built by its ``for_decoder(setup)`` (a class written to the
    protocol alone and without one: without arguments), its stats recorded by name. A token tree takes only
    proposers that can draft several candidates per node (``proposers.tree_proposer_problem``): another is
    refused in one line, never dropped."""
    kinds = {s: NAMED_PROPOSERS[s] for turn, _ in schedule for s in turn if isinstance(s, str)}
    if tree and (why := tree_proposer_problem(kinds)):
        raise ArgumentError(f"a token tree with {why}")
    named = {s: build(c, setup) for s, c in kinds.items()}
    stats.proposers.update({name: p.stats for name, p in named.items()})
    watching = [named[s] for s, c in kinds.items() if capabilities(c).watches]

    def one(s: str | int) -> Proposer:
        if isinstance(s, str):
            return named[s]
        return ModelProposer(s, members[s], setup.sampling, setup.generator, audit, setup.least_reach > 0)

    turns = [(one(turn[0]) if len(turn) == 1 else Chain([one(s) for s in turn]), gamma) for turn, gamma in schedule]
    return turns, watching


@contextmanager
def _concurrent(decoder: Decoder, plan: Plan) -> Iterator[None]:
    """For ``E_p`` methods: the decoder's concurrent forwards, their threads alive while it runs."""
    if not plan.concurrent:
        yield
        return
    with ConcurrentForwards([decoder.members[i] for i in plan.members]) as concurrent:
        decoder.concurrent = concurrent
        try:
            yield
        finally:
            decoder.concurrent = None


@dataclass(frozen=True)
class Settings:
    """One generation's settings: every argument of :func:`generate` but the models and the prompt, carried as one
    object (``generate`` keeps its keyword signature for users and builds one; :func:`decode` takes it). Each is
    checked by ``decode`` before anything runs; their meaning is ``generate``'s."""

    method: str = "large_model"
    gamma: int | Sequence[int] = 1
    max_new_tokens: int = 128
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    method_args: dict[str, Any] | None = None
    seed: int = 0
    eos_token_id: int | Sequence[int] | None = None
    stop_strings: Sequence[str] = ()
    tokenizer: Any = None
    tokenizers: Sequence[Any] | None = None
    vocab_size: int | None = None
    audit: Audit | None = None
    gamma_schedule: str = "fixed"
    tree: Any = None
    corpus: Any = None


def generate(
    models: Sequence[torch.nn.Module],
    prompt_ids: Sequence[int] | torch.Tensor,
    method: str = "large_model",
    gamma: int | Sequence[int] = 1,
    max_new_tokens: int = 128,
    temperature: float = 0.0,
    top_k: int = 0,
    top_p: float = 1.0,
    method_args: dict[str, Any] | None = None,
    seed: int = 0,
    eos_token_id: int | Sequence[int] | None = None,
    *,
    stop_strings: Sequence[str] = (),
    tokenizer: Any = None,
    tokenizers: Sequence[Any] | None = None,
    vocab_size: int | None = None,
    audit: Audit | None = None,
    gamma_schedule: str = "fixed",
    tree: Any = None,
    corpus: Any = None,
) -> GenerationResult:
    """Generate a continuation of ``prompt_ids`` with ``method`` (its arguments: docs/decoder.md).

    ``models`` are loaded causal LMs in the order the method names them (``[target, draft]`` for ``sd``,
    ``[expert, amateur]`` for ``cd*``, the weight order for ``we*``; ``large_model`` runs ``models[0]``,
    ``small_model`` ``models[-1]``). ``gamma`` is an int, or for ``*_se`` one per model; ``gamma_schedule="dynamic"``
    lets each proposer's gamma move between rounds (``loop.DynamicGamma``; speculative methods only, the largest
    model's excepted: ``fixed_turns``). ``method_args``: the ensemble's parameters, ``first_proposer`` and
    ``proposer`` (``draft``, ``lookup``, ``suffix``, ``lookup+draft``, ...: ``proposers.parse_proposer``). ``tree``
    drafts a token tree per round instead of a chain (``tree/loop.py``). ``corpus``: what ``suffix`` and ``recycle``
    may read beside the context, one prompt's view of the job's corpus (``corpus.Corpus.view``). Stop strings need
    a ``tokenizer``; tests pass an ``audit`` (``audit.py``) to have every distribution recomputed. Models with
    different tokenizers take ``tokenizers`` (one per model) and decode over the union of their vocabularies
    (docs/tokenizers.md): ``prompt_ids`` are the first model's ids, ``token_ids`` union ids, ``pieces`` and
    ``text`` their text. Raises ``ValueError`` on any bad argument before decoding.
    """
    return decode(
        models,
        prompt_ids,
        Settings(
            method,
            gamma,
            max_new_tokens,
            temperature,
            top_k,
            top_p,
            method_args,
            seed,
            eos_token_id,
            stop_strings,
            tokenizer,
            tokenizers,
            vocab_size,
            audit,
            gamma_schedule,
            tree,
            corpus,
        ),
    )


def decode(
    models: Sequence[torch.nn.Module], prompt_ids: Sequence[int] | torch.Tensor, s: Settings
) -> GenerationResult:
    """:func:`generate` with its settings as one object (``Settings``)."""
    if not isinstance(models, (list, tuple)) or not models:
        raise ArgumentError("models must be a non-empty list of causal LMs")
    check_loaded(models)
    audit = s.audit  # a joined set's audit wraps it (below)
    names = [model_name(m, i) for i, m in enumerate(models)]
    spec = parse_method(s.method)  # the one parse of the method's name in this call
    union = None if s.tokenizers is None else join(models, s.tokenizers, spec, names)
    vocab = check_vocab_size(models, s.vocab_size) if union is None else head_rows(models[0])
    if s.method_args is not None and not isinstance(s.method_args, dict):
        raise ArgumentError(f"method_args={s.method_args!r}: expected a dict of argument names to values")
    if s.corpus is not None and not isinstance(s.corpus, CorpusView):
        raise ArgumentError(
            f"corpus={type(s.corpus).__name__}: expected one prompt's view of a corpus, Corpus(...).view(prompt_id)"
        )
    sizes = parameter_counts(models)
    restricted = restricted_heads(models)
    plan, resolved = plan_method(spec, sizes, s.gamma, dict(s.method_args or {}), restricted)
    sampling = check_sampling(s.temperature, s.top_k, s.top_p, s.max_new_tokens)
    spec.check_temperature(sampling.temperature)
    dynamic = check_gamma_schedule(s.gamma_schedule)
    if not spec.own_loop:  # the schedule of our speculative loop only
        dynamic = None
    else:
        resolved["gamma_schedule"] = s.gamma_schedule
    shape = parse_tree(s.tree)
    if shape is not None:
        check_tree_models(models, spec)
        if union is not None:
            raise ArgumentError(f"tree={s.tree!r} with {mixed_tokenizers_problem()}")
        resolved["tree"] = shape.label
    prompt = prompt_list(prompt_ids, vocab)
    if s.stop_strings and s.tokenizer is None and union is None:
        raise ArgumentError("stop_strings need a tokenizer to decode the output")
    check_seed(s.seed)
    eos, decode = eos_set(s.eos_token_id, vocab), s.tokenizer.decode if s.tokenizer else None
    stats = GenerationStats(method=s.method, prompt_tokens=len(prompt))
    if union is not None:  # the decoder runs over union ids (joined.py)
        joined = Joined(union, prompt, sampling, stats)
        prompt, sampling, eos, decode = joined.prompt, joined.sampling, joined.eos(eos), union.text
    stopper = Stopper(s.max_new_tokens, eos, s.stop_strings, decode)
    used = sorted(set(plan.members) | {i for turn, _ in plan.schedule or [] for i in turn if is_int(i)})
    check_context(models, range(len(models)) if spec.peer else used, len(prompt), s.max_new_tokens)
    for i in used if union is not None else ():  # each member's own prompt (at least one own token per new one)
        check_context(models, [i], len(joined.own_prompts[i]), s.max_new_tokens)

    def result(tokens: list[int], stats: GenerationStats) -> GenerationResult:
        if union is not None:
            return GenerationResult(tokens, stats, union.text(tokens), resolved, joined.pieces(tokens))
        text = s.tokenizer.decode(tokens, skip_special_tokens=True) if s.tokenizer is not None else None
        return GenerationResult(tokens, stats, text, resolved)

    if spec.peer:
        if audit is not None:
            raise ArgumentError(f"{s.method!r} runs transformers' generate: an audit checks our decoder only")
        spec.check_heads([head_rows(m) for m in models])  # transformers' own: its heads are not cropped
        return result(*run_peer(spec, models, prompt, resolved, sampling, stopper, s.seed))

    device = next(models[used[0]].parameters()).device
    stats.models = [ModelStats() for _ in models]
    max_len = len(prompt) + s.max_new_tokens + 1  # the most positions a runner is fed
    if union is None:
        members = [Member(make_runner(m, vocab, stats.models[i], max_len, device)) for i, m in enumerate(models)]
    else:
        members = []
        for i, m in enumerate(models):  # each over its own output head (joined.py)
            own = make_runner(m, head_rows(m), stats.models[i], joined.max_len(i, s.max_new_tokens), device)
            members.append(Member(joined.runner(i, own)))
        audit = None if audit is None else joined.audit(audit)
    generator = None if sampling.greedy else torch.Generator(device=device).manual_seed(s.seed)
    decoder = Decoder(
        members=members,
        targets=plan.members,
        target_fn=plan.target_fn,
        sampling=sampling,
        stopper=stopper,
        generator=generator,
        stats=stats,
        device=device,
        audit=audit,
        dynamic=dynamic,
        fixed_turns=fixed_turns(plan.schedule, sizes) if dynamic or shape else frozenset(),
        mixture=None if plan.mixture is None else torch.tensor([plan.mixture], dtype=torch.float64, device=device),
        least_reach=resolved.get("least_reach", 0.0),
    )
    schedule = None
    if plan.schedule:
        setup = ProposerSetup(members, sampling, generator, s.corpus, decoder.least_reach)
        schedule, decoder.watchers = _proposers(plan.schedule, members, setup, stats, audit, shape is not None)
    events = None
    if device.type == "cuda":  # device time too: CUDA events around the whole decode
        torch.cuda.synchronize(device)
        events = [torch.cuda.Event(enable_timing=True) for _ in range(2)]
        events[0].record()
    start = time.perf_counter()
    try:
        with torch.inference_mode(), _concurrent(decoder, plan):
            tokens = decoder.run(prompt, schedule, tree_loop(shape) if shape is not None else None)
    finally:  # a proposer that reads a model's forwards (eagle) stops reading them
        for proposer, _ in schedule or []:
            for p in parts(proposer):
                close(p)
    if events is not None:
        events[1].record()
        torch.cuda.synchronize(device)  # the clock is read only once the device is done
        stats.device_time_s = events[0].elapsed_time(events[1]) / 1000
    stats.wall_time_s = time.perf_counter() - start
    stats.new_tokens = len(tokens)
    return result(tokens, stats)
