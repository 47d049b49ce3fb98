"""The benchmark's variants: every method of its table, each in the group whose baseline it is compared with."""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import product
from typing import Any

from pipeline.decoding.forms import FORMS
from pipeline.decoding.spec import parse_method


def in_turn(method: str) -> bool:
    """Every model proposes in turn (``E_se``): it takes one gamma per model."""
    return parse_method(method).in_turn


@dataclass
class Variant:
    group: str  # which baseline it is compared with
    label: str
    method: str  # a decoder method (transformers' own ``hf_*`` included)
    gamma: Any = 1
    temperature: float = 0.0
    method_args: dict = field(default_factory=dict)
    baseline: bool = False
    gamma_schedule: str = "fixed"
    tree: str | None = None  # a token tree per round (decoding/tree/)


def variants(
    gammas: list[int],
    proposer: str | list[str],
    dynamic: list[int] = (),
    parallel: bool = False,
    sd_temperature: float = 0.0,
    trees: list[str] = (),
    reaches: list[float] = (0.0,),
) -> list[Variant]:
    """Every method of the table, transformers' own (``hf_*``) included; ``proposer``: one, or several (each
    speculative variant once per proposer, its label ending in ``[proposer]``: a sweep of proposers measured
    interleaved in one run); ``dynamic``: starting gammas of dynamic-gamma variants; ``parallel``: we_p, cd_p;
    ``sd_temperature``: of the first group; ``trees``: each speculative method with each token tree, beside a
    chain of as many nodes (``tree_variants``); ``reaches``: each speculative variant once per ``least_reach``
    (several: its label ending in ``ρ=...``)."""
    we = {"lambda": 0.5}
    proposers = [proposer] if isinstance(proposer, str) else list(proposer)
    t = sd_temperature
    first = "greedy" if t == 0 else f"sd T={t:g}"  # large_model, small_model, sd and the peers

    def speculative(group: str, methods: list[str], temperature: float, args: dict) -> list[Variant]:
        """Each method at each fixed gamma, then from each dynamic start (``*_se``: the small model's gamma 1),
        with each proposer."""
        out = []
        for p, rho in product(proposers, reaches):
            tag_p = (f" [{p}]" if len(proposers) > 1 else "") + (f" ρ={rho:g}" if len(reaches) > 1 else "")
            with_p = {**args, "proposer": p, **({"least_reach": rho} if rho else {})}
            mine = []
            for schedule, starts, tag in (("fixed", gammas, ""), ("dynamic", dynamic, " dyn")):
                for m, g in product(methods, starts):
                    gamma, shown = ([1, g], f"[1,{g}]") if in_turn(m) else (g, g)
                    label = f"{m}{tag} g={shown}{tag_p}"
                    mine.append(Variant(group, label, m, gamma, temperature, with_p, gamma_schedule=schedule))
            out += mine + tree_variants(group, methods, temperature, with_p, trees, [v.label for v in mine], tag_p)
        return out

    def ensemble(name: str, args: dict, temperature: float) -> list[Variant]:
        """An ensemble's group: the ensemble (its baseline), its speculative methods, its parallel form."""
        group = f"{name} T={temperature:g}"
        out = [Variant(group, name, name, temperature=temperature, method_args=args, baseline=True)]
        out += speculative(group, [name + f.suffix for f in FORMS if f.own_loop and f.suffix], temperature, args)
        if parallel:
            out.append(Variant(group, f"{name}_p", f"{name}_p", temperature=temperature, method_args=args))
        return out

    return [
        Variant(first, "large_model", "large_model", temperature=t, baseline=True),
        Variant(first, "small_model", "small_model", temperature=t),
        *speculative(first, ["sd"], t, {}),
        *(Variant(first, f"{m} g={g}", m, g, t) for m in ("hf_assisted", "hf_prompt_lookup") for g in gammas),
        *ensemble("we", we, 1.0),
        Variant("we T=1", "we_me", "we_me", temperature=1.0, method_args=we),
        # we_me_sd: the draft drafts for the ensemble
        *(Variant("we T=1", f"{m} g={g}", m, g, 1.0, we) for m in ("we_me_sd", "hf_assisted_ensemble") for g in gammas),
        *ensemble("cd", {"alpha": 0.1}, 0.0),
    ]


TREE_DEPTH = 4  # a dynamic tree's depth (its gamma); the chain it is compared with drafts its node budget


def tree_variants(
    group: str, methods: list[str], temperature: float, args: dict, trees: list[str], taken: list[str], tag: str = ""
) -> list[Variant]:
    """Each method with each tree, and a chain of the tree's node budget (unless already a variant): the
    chain and the tree verify as many tokens per target forward. ``*_se``: the large model drafts 1. ``tag``:
    the proposer's, at the end of each label."""
    from pipeline.decoding.tree.loop import parse_tree

    out: list[Variant] = []
    for m, value in product(methods, trees):
        shape = parse_tree(value)
        se = in_turn(m)
        chain = ([1, shape.nodes], f"[1,{shape.nodes}]") if se else (shape.nodes, shape.nodes)
        label = f"{m} g={chain[1]}{tag}"
        if label not in taken + [v.label for v in out]:
            out.append(Variant(group, label, m, chain[0], temperature, args))
        gamma = [1, TREE_DEPTH] if se else TREE_DEPTH
        out.append(Variant(group, f"{m} {shape.label}{tag}", m, gamma, temperature, args, tree=shape.label))
    return out


def select(vs: list[Variant], groups: list[str] | None, methods: list[str] | None) -> list[Variant]:
    """The variants of the named groups (``sd``: large_model, small_model, sd; ``we``; ``cd``), or all of them;
    of those, only the named methods and the baselines of their groups, or all of them."""
    vs = [v for v in vs if not groups or ("sd" if v.group == "greedy" else v.group.split()[0]) in groups]
    if methods:
        kept = {v.group for v in vs if v.method in methods}
        vs = [v for v in vs if v.method in methods or v.baseline and v.group in kept]
    return vs


def same_budget_chain(v: Variant, vs: list[Variant]) -> Variant | None:
    """For a tree variant: the chain variant of its method and group drafting the tree's node budget."""
    if not v.tree:
        return None
    from pipeline.decoding.tree.loop import parse_tree

    nodes = parse_tree(v.tree).nodes
    gamma = [1, nodes] if in_turn(v.method) else nodes
    key = (v.group, v.method, gamma, None, v.method_args)
    return next((w for w in vs if (w.group, w.method, w.gamma, w.tree, w.method_args) == key), None)
