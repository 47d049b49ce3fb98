"""The run's control: the null cell (``grid.null_cell``), the large model timed side by side against itself. It has
no effect to find, so its speed-up's interval should cover 1.00 (docs/speed.md, "The null cell"). When it does not,
the pairing itself was biased in this run (the machine, the order of a pair), and every figure of the run is
suspect: one line (``Control.line``) says so at the top of every table (Markdown and HTML), of summary.md, of the
notebook, in results.json (``control``) and in the experiment's W&B run (``control/*``).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import pandas as pd


@dataclass(frozen=True)
class Control:
    """The null cell's side-by-side speed-up with its interval (``cell`` None: the run has no null cell, or it
    is not finished)."""

    cell: str | None = None
    speedup: float | None = None
    low: float | None = None
    high: float | None = None
    confidence: float = 0.95

    @property
    def covers(self) -> bool | None:
        """Whether the null's interval covers 1.00 (None: nothing to judge)."""
        if self.low is None or self.high is None:
            return None
        return self.low <= 1.0 <= self.high

    @property
    def missed(self) -> bool:
        return self.covers is False

    @property
    def line(self) -> str | None:
        """The one line that flags the run (None when the control covers 1.00 or there is none)."""
        if not self.missed:
            return None
        return (
            f"**Control missed: this run's null cell (the large model timed against itself) reads "
            f"{self.speedup:.2f}x [{self.low:.2f}, {self.high:.2f}], its {self.confidence:.0%} interval excluding "
            "1.00x: the pairing was biased in this run, so read every speed-up here as suspect and run it again on "
            "a quiet machine (docs/speed.md, \"The null cell\").**"
        )

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "covers": self.covers, "line": self.line}


def null_control(cells: pd.DataFrame, figures: pd.DataFrame, confidence: float) -> Control:
    """The run's control from the collected figures (``figures.collect``): the null cell's whole-cell
    ``speedup_side_by_side`` and its interval."""
    if cells.empty or "kind" not in cells:
        return Control(confidence=confidence)
    null = cells.loc[cells["kind"].eq("null"), "id"]
    if null.empty:
        return Control(confidence=confidence)
    f = figures[
        figures["cell"].eq(null.iloc[0]) & figures["metric"].eq("speedup_side_by_side") & figures["category"].eq("")
    ]
    if f.empty:
        return Control(null.iloc[0], confidence=confidence)

    def number(x) -> float | None:
        return None if x is None or (isinstance(x, float) and math.isnan(x)) else float(x)

    value, low, high = (number(f.iloc[0][k]) for k in ("value", "low", "high"))
    return Control(null.iloc[0], value, low, high, confidence)
