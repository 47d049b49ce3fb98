"""How a ``pipeline`` subcommand is declared (``@command``: its name, help and arguments, kept on the function)
and how the command runs one (``build``, ``run``); the subcommands themselves are listed in ``cli/__init__.py``."""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import UserError
from ..files import JSONError, parse_json


@dataclass(frozen=True)
class Command:
    name: str
    help: str
    arguments: tuple[tuple[tuple, dict], ...]
    passthrough: bool  # it takes its own command line, untouched: ``run(argv)``
    run: Callable


def arg(*flags, **options) -> tuple[tuple, dict]:
    return flags, options


def named_options(args: argparse.Namespace, names: str) -> dict:
    """The named options of a command line (names separated by spaces), by name."""
    return {name: getattr(args, name) for name in names.split()}


def command(name: str, help: str, *arguments: tuple[tuple, dict], passthrough: bool = False):
    """Declare the decorated function subcommand ``name`` with its arguments: ``run(args) -> exit code``, a
    passthrough command's ``run(argv) -> exit code``. It runs once listed in ``cli/__init__.py``."""

    def declare(run: Callable) -> Callable:
        run.command = Command(name, help, arguments, passthrough, run)
        return run

    return declare


def build(functions: Sequence[Callable]) -> argparse.ArgumentParser:
    """The command's parser, its subcommands in the order given."""
    parser = argparse.ArgumentParser(prog="pipeline", description="Fast LLM ensembles through speculation")
    subcommands = parser.add_subparsers(dest="command", required=True)
    for spec in (f.command for f in functions):
        sub = subcommands.add_parser(spec.name, help=spec.help, add_help=not spec.passthrough)
        for flags, options in spec.arguments or [(("rest",), {"nargs": argparse.REMAINDER})]:
            sub.add_argument(*flags, **options)
    return parser


def subparser(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
    """Subcommand ``name``'s parser."""
    return next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[name]


def inline_json(text: str, what: str) -> Any:
    """An argument given as inline JSON; one line naming it (``what`` it is) when it is not JSON."""
    try:
        return parse_json(text, what)  # bounded: nesting, integers' length
    except JSONError as err:
        raise UserError(f"{what} {text[:80]!r}: not JSON ({err.msg})") from None


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


def run(parser: argparse.ArgumentParser, functions: Sequence[Callable], argv: list[str] | None = None) -> int:
    """Run the subcommand ``argv`` names; a user's mistake is one line and exit code 2."""
    argv = sys.argv[1:] if argv is None else argv
    specs = {f.command.name: f.command for f in functions}
    try:
        if argv and argv[0] in specs and specs[argv[0]].passthrough:
            return specs[argv[0]].run(argv[1:])
        args = parser.parse_args(argv)
        if getattr(args, "threads", None):
            import torch

            torch.set_num_threads(args.threads)
        return specs[args.command].run(args)
    except UserError as err:  # a user's mistake: one line, no traceback (a bug keeps its traceback)
        print(f"error: {err}", file=sys.stderr)
        return 2
