"""What the measured forward costs predict for ``we_me`` over ``we`` on the default pair.

    python scripts/mixture_costs.py [--lambda 0.5] [--reps 31]

Measures the median cost of a forward of n = 1..6 new tokens (after 200
cached ones) of the bundled model and of its distilled 2-layer draft, on the
kernels the benchmark uses, with the threads torch has (set OMP_NUM_THREADS).
``we`` runs both models on one token per position; ``we_me`` runs the member
drawn for a position on the tokens it missed since it last ran, n ~
Geometric(w_k) of them. Predicted time per token: ``c_L(1) + c_S(1)`` against
``sum_k w_k E[c_k(n_k)]``, printed with catch-ups priced at their length and
at one token.
"""

from __future__ import annotations

import argparse

import torch

from pipeline.measure.forward_timing import forward_costs
from pipeline.models import BUNDLED, Recipe, cpu_kernels, ensure_draft, load, load_bundled

SIZES = (1, 2, 3, 4, 6)


def expected_cost(cost: dict[int, float], w: float) -> float:
    """Mean cost of a catch-up forward of n ~ Geometric(w) tokens (longer than measured: the longest measured)."""
    total = 0.0
    for n in range(1, 200):
        total += w * (1 - w) ** (n - 1) * cost[min([k for k in cost if k >= n], default=max(cost))]
    return total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lambda", dest="lam", type=float, default=0.5, help="the draft's weight")
    ap.add_argument("--reps", type=int, default=31)
    args = ap.parse_args()
    target, _ = load_bundled(pack=False)
    draft = load(ensure_draft(BUNDLED, Recipe(layers=2)), pack=False)[0]
    if cpu_kernels.available():
        cpu_kernels.pack_linears(target)
        cpu_kernels.pack_linears(draft)
    cost = {}
    with torch.inference_mode():
        for name, model in (("target", target), ("draft", draft)):
            cost[name] = forward_costs(model, "eager", list(SIZES), context=200, repeats=args.reps)
            print(f"{name}: ms per forward of n tokens", {n: round(c, 1) for n, c in cost[name].items()})
    w = {"target": 1 - args.lam, "draft": args.lam}
    we = cost["target"][1] + cost["draft"][1]
    me = sum(w[k] * expected_cost(cost[k], w[k]) for k in cost)
    me_one = sum(w[k] * cost[k][1] for k in cost)
    print(f"we: {we:.1f} ms/token; we_me: {me:.1f} ms/token (catch-ups at their length), {me_one:.1f} (at one token)")
    print(f"predicted we_me over we: {we / me:.2f}x (catch-up costs included), {we / me_one:.2f}x (one-token costs)")


if __name__ == "__main__":
    main()
