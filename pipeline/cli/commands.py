"""The ``pipeline`` command's registry: each subcommand is a function registered with ``@command``, and
``main`` runs the one named (``cli/__init__.py`` imports the modules that register them; ``pipeline --help``
lists them in the order registered)."""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Callable
from typing import Any

from ..errors import UserError

PARSER = argparse.ArgumentParser(prog="pipeline", description="Fast LLM ensembles through speculation")
SUBCOMMANDS = PARSER.add_subparsers(dest="command", required=True)
COMMANDS: dict[str, tuple[Callable, bool]] = {}  # name -> (run, passthrough: it takes its own command line, untouched)


def arg(*flags, **options) -> tuple[tuple, dict]:
    return flags, options


def named_options(args: argparse.Namespace, names: str) -> dict:
    """The named options of a command line (names separated by spaces), by name."""
    return {name: getattr(args, name) for name in names.split()}


def command(name: str, help: str, *arguments: tuple[tuple, dict], passthrough: bool = False):
    """Register the decorated function as subcommand ``name`` with its arguments: ``run(args) -> exit code``, a
    passthrough command's ``run(argv) -> exit code``."""
    sub = SUBCOMMANDS.add_parser(name, help=help, add_help=not passthrough)
    for flags, options in arguments or [(("rest",), {"nargs": argparse.REMAINDER})]:
        sub.add_argument(*flags, **options)

    def register(run: Callable) -> Callable:
        COMMANDS[name] = run, passthrough
        return run

    return register


def inline_json(text: str, what: str) -> Any:
    """An argument given as inline JSON; one line naming it (``what`` it is) when it is not JSON."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise UserError(f"{what} {text[:80]!r}: not JSON ({err})") from None


def number(low: float, high: float = math.inf, low_open: bool = False, high_open: bool = False):
    """An argparse type: a finite number in the given range (an open end excluded); anything else is argparse's
    one-line usage error naming the flag and what it accepts."""
    ends = (
        ("(" if low_open else "[")
        + f"{low:g}, "
        + (f"{high:g}" if math.isfinite(high) else "inf")
        + (")" if high_open or not math.isfinite(high) else "]")
    )

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        inside = (value > low if low_open else value >= low) and (value < high if high_open else value <= high)
        if not math.isfinite(value) or not inside:
            raise argparse.ArgumentTypeError(f"{text[:40]!r}: expected a finite number in {ends}")
        return value

    parse.__name__ = "number"
    return parse


def name_text(text: str) -> str:
    """An argparse type: a non-empty name of printable characters."""
    if not text.strip() or not text.isprintable() or len(text) > 100:
        raise argparse.ArgumentTypeError(f"{text[:40]!r}: expected a name (printable, 1 to 100 characters)")
    return text


THREADS = arg("--threads", type=int, help="CPU threads for torch")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        if argv and argv[0] in COMMANDS and COMMANDS[argv[0]][1]:
            return COMMANDS[argv[0]][0](argv[1:])
        args = PARSER.parse_args(argv)
        if getattr(args, "threads", None):
            import torch

            torch.set_num_threads(args.threads)
        return COMMANDS[args.command][0](args)
    except UserError as err:  # a user's mistake: one line, no traceback (a bug keeps its traceback)
        print(f"error: {err}", file=sys.stderr)
        return 2
