"""What an engine does, as one record (``Behaviour``): the other half of its facts (``decoding/engines.py``)."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any

from ..decoding.engines import Runs, RunsCell


def _runs_here(_architectures: list[str]) -> list[str]:
    return []  # loads every architecture the project does


def _any_head(_speculator: str | None, _model: str, _entry: Any) -> str | None:
    return None  # runs every head the config check admits


@dataclass(frozen=True)
class Behaviour:
    """An engine's behaviour: how a generation job runs a cell, and what the config check asks of the engine."""

    runs: Callable[[RunsCell, ExitStack], Runs]  # the cell's models readied (closed with ``stack``)
    availability: Callable[[], str | None] = lambda: None  # None where it can run here, else one line why not
    cannot_load: Callable[[list[str]], list[str]] = _runs_here  # a model's ``architectures`` it has no class for
    head_problem: Callable[[str | None, str, Any], str | None] = _any_head  # (its speculator, model name, the
    # model's ``eagle`` entry) -> why it cannot run that feature head, or None
