"""What a competing process does to a timed run, by the run's own signals (``timing.Probe``): one thread spun for a
few seconds alone, beside busy processes at normal priority and at ``nice 19`` (the priority the workflow gives
every job but generation). Prints a Markdown table (docs/speed.md, "Interference"):

    python -m pipeline.measure.competitors [--seconds 3]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time

from .timing import Probe

SPIN = "while True: pass"


def spin(seconds: float) -> dict:
    with Probe() as probe:
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            pass
    return probe.result


def measure(busy: int, nice: int, seconds: float) -> dict:
    """A spin of ``seconds`` beside ``busy`` spinning processes at niceness ``nice``."""
    prefix = ["nice", "-n", str(nice)] if nice else []
    others = [subprocess.Popen([*prefix, sys.executable, "-c", SPIN]) for _ in range(busy)]
    try:
        time.sleep(0.3)  # the competitors are running
        return spin(seconds)
    finally:
        for p in others:
            p.kill()
            p.wait()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=3.0, help="of each timed spin (default 3)")
    args = parser.parse_args(argv)
    if not args.seconds > 0:
        parser.error(f"--seconds {args.seconds}: expected a positive number")
    print("| beside the run | its own wait | machine pressure | its preemptions |\n|---|---|---|---|")
    for label, busy, nice in (
        ("nothing", 0, 0),
        ("one busy process", 1, 0),
        ("two busy processes", 2, 0),
        ("two busy processes at `nice 19`", 2, 19),
    ):
        r = measure(busy, nice, args.seconds)
        wall = r["wall_s"]
        wait = "n/a" if r["wait_s"] is None else f"{r['wait_s'] / wall:.3f} s/s"
        psi = "n/a" if r["psi_some_s"] is None else f"{r['psi_some_s'] / wall:.3f} s/s"
        print(f"| {label} | {wait} | {psi} | {r['nivcsw'] / wall:.0f}/s |")


if __name__ == "__main__":
    main()
