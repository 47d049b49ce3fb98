"""Feature heads trained for an ensemble against the head of the model alone, on the bundled model: each head's
held-out acceptance by the model and by the ensemble, same data, steps and seed (docs/proposers.md).
``python -m pipeline.bench.heads --help``.

Both heads are trained on first use through the model cache, as a config's ``eagle`` entries would be (the model
alone: ``eagle: {steps: N}``; for the ensemble: ``eagle: {steps: N, target: {method, members, method_args}}``, the
members the default config's models of those names). Each head's first proposal after every position of the same
held-out continuations (the model's greedy continuations of HumanEval prompts, its true features) is scored against
the model's distribution and against the ensemble's: greedy agreement with their argmax and expected acceptance at
T=1 (the sum over tokens of min(p, q)). Prints a Markdown table; ``--json`` records every figure.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ..errors import UserError
from ..files import parse_json, write_atomic


def method_args(text: str) -> dict:
    """``--method-args``: bounded JSON (a JSONError is a ValueError: argparse's one-line usage error)."""
    return parse_json(text, "--method-args")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipeline.bench.heads", description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=400, help="training steps of each head (default 400)")
    parser.add_argument("--method", default="we", help="the ensemble (default we)")
    parser.add_argument("--members", nargs="+", default=["smollm2-draft-l2"], help="its other members (default config)")
    parser.add_argument(
        "--method-args", type=method_args, default={"lambda": 0.5}, help='JSON (default {"lambda": 0.5})'
    )
    parser.add_argument(
        "--layouts", nargs="+", default=["ours"], help="the heads' layouts, each trained alike (default ours)"
    )
    parser.add_argument("--alone", action="store_true", help="the heads of the model alone, judged by it alone")
    parser.add_argument("--gamma", type=int, default=3, help="the greedy chains' length (default 3)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", type=Path, help="write every figure here")
    args = parser.parse_args(argv)
    import torch

    from ..models import BUNDLED, ModelError, ModelSpec, load_spec
    from ..models.distill import read_meta
    from ..models.head_files import load_head
    from ..models.head_target import distribution, ensemble_target, for_ensemble
    from ..models.head_training import chain_acceptance, head_acceptance
    from ..models.resolve import ensemble_members, ensure_head, head_recipe
    from ..models.spec import default_entries
    from ..models.teacher import TeacherData, heldout_prompts, teacher_continuations

    torch.set_num_threads(args.threads)
    models = default_entries(head=False)
    unknown = [m for m in args.members if m not in models]
    if unknown:
        raise UserError(f"--members {unknown[0]!r}: accepted: {', '.join(models)}")
    target = {"method": args.method, "members": [models[m] for m in args.members]}
    target["method_args"] = args.method_args
    targets = {"model": None} if args.alone else {"model": None, args.method: target}
    recipes = {
        (layout, name): {"steps": args.steps, "layout": layout, **({"target": t} if t else {})}
        for layout in args.layouts
        for name, t in targets.items()
    }
    try:
        specs = {key: ModelSpec(BUNDLED, eagle=recipe) for key, recipe in recipes.items()}
        dirs = {key: ensure_head(spec) for key, spec in specs.items()}
        teacher, tokenizer = load_spec(ModelSpec(BUNDLED, pack=False))
        recipe = head_recipe(next(iter(specs.values())))
        if not args.alone:
            ensemble_spec = specs[(args.layouts[0], args.method)]
            ensemble_recipe = head_recipe(ensemble_spec)
            members = ensemble_members(ensemble_spec, ensemble_recipe, tokenizer)
            ensemble = ensemble_target(ensemble_recipe.target)
    except ModelError as err:
        raise UserError(str(err)) from None
    held = teacher_continuations(
        teacher, tokenizer, heldout_prompts(recipe.eval_prompts), recipe.new_tokens, recipe.batch, "held-out"
    )
    alone = TeacherData([], list(range(teacher.config.vocab_size)), 1.0, held, 0.0)
    by = {"model": alone}
    if not args.alone:
        by[args.method] = for_ensemble(alone, [teacher, *members], distribution(ensemble, [teacher, *members]))
    rows = []
    for (layout, _), path in dirs.items():
        head = load_head(path, teacher)
        meta = read_meta(path)
        row = {"layout": layout, "trained_for": meta.get("target", "model"), "dir": str(path)}
        row.update(train_seconds=meta.get("train_seconds"), total_seconds=meta.get("total_seconds"))
        for judge, data in by.items():
            facts = head_acceptance(head, teacher, data.held)
            row[f"agreement_{judge}"], row[f"acceptance_t1_{judge}"] = facts["agreement"], facts["acceptance_t1"]
            chain = chain_acceptance(head, teacher, data.held, args.gamma)
            row[f"tau_{judge}"], row[f"depth_acceptance_{judge}"] = chain["tau"], chain["depth_acceptance"]
        rows.append(row)
    judges = list(by)
    print(f"feature heads of the bundled model, {args.steps} steps each, {recipe.eval_prompts} held-out prompts")
    print(f"(tau: greedy chains of {args.gamma} from every held-out position; train s: the training steps' time)")
    head_cells = [f"{k} by {j}" for j in judges for k in ("T=0", "T=1", f"tau g={args.gamma}")]
    print("| layout | trained for | " + " | ".join(head_cells) + " | train s |")
    print("|---|---|" + "---|" * len(head_cells) + "---|")
    for r in rows:
        cells = []
        for j in judges:
            shares = [f"{100 * r[f'{k}_{j}']:.1f}%" for k in ("agreement", "acceptance_t1")]
            cells += [*shares, f"{r[f'tau_{j}']:.2f}"]
        print(f"| {r['layout']} | {r['trained_for']} | " + " | ".join(cells) + f" | {r['train_seconds']} |")
    if args.json:
        write_atomic(args.json, json.dumps({"steps": args.steps, "gamma": args.gamma, "heads": rows}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
