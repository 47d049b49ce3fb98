"""The ``pipeline`` command's registry: each subcommand is a function registered with ``@command``.

``pipeline --help`` lists them in the order registered: ``cli.py`` imports the modules that register them.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Command:
    help: str
    run: Callable  # (args) -> exit code; a passthrough command: (argv) -> exit code
    arguments: tuple[tuple[tuple, dict], ...] = ()
    passthrough: bool = False  # its own command line, untouched


COMMANDS: dict[str, Command] = {}


def arg(*flags, **options) -> tuple[tuple, dict]:
    return flags, options


def named_options(args: argparse.Namespace, names: str) -> dict:
    """The named options of a command line (names separated by spaces), by name."""
    return {name: getattr(args, name) for name in names.split()}


def command(name: str, help: str, *arguments: tuple[tuple, dict], passthrough: bool = False):
    """Register the decorated function as subcommand ``name`` with its arguments."""

    def register(run: Callable) -> Callable:
        COMMANDS[name] = Command(help, run, arguments, passthrough)
        return run

    return register


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="pipeline", description="Fast LLM ensembles through speculation")
    sub = ap.add_subparsers(dest="command", required=True)
    for name, cmd in COMMANDS.items():
        p = sub.add_parser(name, help=cmd.help, add_help=not cmd.passthrough)
        for flags, options in cmd.arguments or [(("rest",), {"nargs": argparse.REMAINDER})]:
            p.add_argument(*flags, **options)
    return ap
