"""The suffix automaton's cost against its text's length: building it and reading its counts once, on repetitive
text (one token repeated, the worst case of the link chain: a model's own looping output) and on varied text
(random tokens over a small vocabulary), each at several lengths (docs/proposers.md, "Suffix automata").

    python -m pipeline.bench.automaton --tokens 10000 100000

Prints a Markdown table: seconds to build, seconds to settle the counts, and the seconds per thousand tokens, which
stay flat when the work is linear in the text.
"""

from __future__ import annotations

import argparse
import random
import time

from ..decoding.corpus import SuffixAutomaton


def timed(tokens: list[int]) -> tuple[float, float]:
    start = time.perf_counter()
    automaton = SuffixAutomaton([tokens])
    built = time.perf_counter()
    automaton.settle()
    return built - start, time.perf_counter() - built


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipeline.bench.automaton", description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", nargs="+", type=int, default=[10_000, 100_000], help="text lengths")
    args = parser.parse_args(argv)
    rng = random.Random(0)
    print("| text | tokens | build s | settle s | s per 1,000 tokens |")
    print("|---|---|---|---|---|")
    for n in args.tokens:
        texts = (("one token repeated", [7] * n), ("random, 64 ids", [rng.randrange(64) for _ in range(n)]))
        for kind, tokens in texts:
            build, settle = timed(tokens)
            print(f"| {kind} | {n:,} | {build:.3f} | {settle:.3f} | {1000 * (build + settle) / n:.4f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
