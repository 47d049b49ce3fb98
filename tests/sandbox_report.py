"""How well the sandbox holds, and what it costs: ``python -m tests.sandbox_report`` (from the repository root).

For each isolation (bubblewrap, guard-only) and scorer (root, an unprivileged
uid): every attack of ``sandbox_attacks.py`` in a scorer of its own, followed by
a correct sample; **escaped** counts attacks that left a trace on the host or
harmed the later sample (or the scorer), **forged** those that passed. Then
the 164 canonical HumanEval solutions (each must pass) and each problem with
the next one's solution (each must fail): **silently wrong** counts verdicts
the other way. Last, the median seconds per canonical sample with each
isolation, and without any sandbox (one plain interpreter running the prompt,
the solution and the tests), sequentially.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import subprocess
import sys
import time

from tasks import get_task
from tasks.sandbox import BUBBLEWRAP, GUARD_ONLY, run_tests

from .sandbox_attacks import (
    ATTACKS,
    RIGHT,
    UNPRIVILEGED,
    attack_code,
    completion,
    make_canaries,
    new_token,
    remove,
    traces,
)
from .sandbox_attacks import score as score_as

# under the guard as root they would signal every process of uid nobody on the machine, other users' included
SIGNAL_EVERYONE = ("kill the parent, then everyone", "kill(-1, 9) left running")


def attacks(task, example, isolation: str, user: int | None) -> tuple[list[str], list[str]]:
    """The attacks that escaped and those that forged a pass."""
    escaped, forged = [], []
    for name, template in ATTACKS.items():
        if isolation == GUARD_ONLY and user is None and os.geteuid() == 0 and name in SIGNAL_EVERYONE:
            continue
        canaries, token = make_canaries(user), new_token()
        run = {**task.sandbox_run(example, completion(attack_code(template, canaries, token))), "isolation": isolation}
        later = {**task.sandbox_run(example, completion(RIGHT)), "isolation": isolation}
        try:
            results = score_as([{**run, "timeout_s": 3, "memory_mb": 512}, later], user)["results"]
        except RuntimeError:
            results = None  # the scorer itself was killed
        left = traces(token, canaries)
        remove(canaries, token)
        _end_survivors(token)
        if left or results is None or not results[1]["passed"]:
            escaped.append(name)
        if results is not None and results[0]["passed"]:
            forged.append(name)
    return escaped, forged


def _end_survivors(token: str) -> None:
    """Processes an escaped attack left running (they carry its token): ended by their ids."""
    for line in traces(token, []):
        with contextlib.suppress(OSError):
            os.kill(int(line.split()[1]), 9)


def verdicts(task, examples, isolation: str) -> tuple[int, list[float]]:
    """Verdicts the wrong way round on the canonical solutions and on shifted ones; seconds per canonical sample."""
    wrong, seconds = 0, []
    for i, example in enumerate(examples):
        right = run_tests(**task.sandbox_run(example, example.reference["canonical"]), isolation=isolation)
        seconds.append(right.seconds)
        shifted = examples[(i + 1) % len(examples)].reference["canonical"]
        wrong += (not right.passed) + run_tests(**task.sandbox_run(example, shifted), isolation=isolation).passed
    return wrong, seconds


def bare_seconds(task, examples) -> list[float]:
    """The same programs in one plain interpreter each, without any sandbox."""
    out = []
    for example in examples:
        run = task.sandbox_run(example, example.reference["canonical"])
        program = f"{run['solution']}\n\n{run['tests']}"
        start = time.perf_counter()
        subprocess.run([sys.executable, "-I", "-S", "-c", program], check=True, capture_output=True)
        out.append(time.perf_counter() - start)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--isolation", nargs="+", default=[BUBBLEWRAP, GUARD_ONLY])
    args = parser.parse_args()
    task = get_task("humaneval")
    examples = task.load("full")
    scorers = {"root": None, "non-root": UNPRIVILEGED} if os.geteuid() == 0 else {"non-root": None}
    bare = statistics.median(bare_seconds(task, examples))
    print(f"no sandbox: {bare * 1000:.0f} ms per sample (median over {len(examples)} canonical solutions)")
    for isolation in args.isolation:
        for who, user in scorers.items():
            escaped, forged = attacks(task, examples[0], isolation, user)
            skipped = SIGNAL_EVERYONE if isolation == GUARD_ONLY and user is None and os.geteuid() == 0 else ()
            print(
                f"{isolation}, scorer {who}: {len(ATTACKS) - len(skipped)} attacks, escaped {len(escaped)}, "
                f"forged {len(forged)}"
                + (f" (not run: {', '.join(skipped)})" if skipped else "")
                + (f"; escaped: {', '.join(escaped)}" if escaped else "")
                + (f"; forged: {', '.join(forged)}" if forged else "")
            )
        wrong, seconds = verdicts(task, examples, isolation)
        median = statistics.median(seconds)
        print(
            f"{isolation}: silently wrong {wrong} of {2 * len(examples)} verdicts; {median * 1000:.0f} ms per sample, "
            f"{(median - bare) * 1000:+.0f} ms over no sandbox (medians over {len(examples)} canonical solutions)"
        )


if __name__ == "__main__":
    main()
