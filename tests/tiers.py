"""The quick tier of the exactness suites (marker ``exhaustive``; README "Tests", tests/README.md).

A conformance test crosses ensembles, forms and proposers with temperatures, gammas and tree shapes. One marked
``@pytest.mark.spread("setting", ...)`` runs in the quick tier (``make test``) each combination of its other
parameters once, in collection order, at the values of the spread parameters that its earlier quick cases ran least
with this case's other values, then least at all (ties: the first in collection order); a spread value no case took
then runs too. Its other cases are marked ``exhaustive``: ``make test-all`` (CI) runs them too. The rule reads the
parameters only, so a newly registered ensemble or proposer lands in the quick tier with no list edited.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any


def quick(params: Sequence[dict[str, Any]], spread: Sequence[str]) -> list[bool]:
    """Which of one test's cases (their parameters, in collection order) the quick tier runs."""
    spread = tuple(spread)
    if missing := {name for p in params for name in spread if name not in p}:
        raise ValueError(f"spread names parameters the test does not take: {sorted(missing)}")
    values = [{name: repr(value) for name, value in p.items()} for p in params]  # values need not be hashable
    runs: Counter = Counter()  # (spread name, value) and (spread name, value, other name, value): quick cases
    chosen = [False] * len(params)

    def choose(i: int) -> None:
        chosen[i] = True
        for name in spread:
            runs[name, values[i][name]] += 1
            runs.update((name, values[i][name], other, v) for other, v in values[i].items() if other not in spread)

    def run_so_far(i: int) -> tuple[int, int]:  # its spread values with its other values, then at all
        mine = [(name, values[i][name]) for name in spread]
        together = sum(runs[s, v, other, w] for s, v in mine for other, w in values[i].items() if other not in spread)
        return together, sum(runs[s, v] for s, v in mine)

    groups: dict[tuple, list[int]] = {}
    for i, v in enumerate(values):
        groups.setdefault(tuple((k, x) for k, x in sorted(v.items()) if k not in spread), []).append(i)
    for cases in groups.values():
        choose(min(cases, key=run_so_far))  # min: the first of the least run
    for name in spread:
        for value in dict.fromkeys(v[name] for v in values):
            if not runs[name, value]:
                choose(min((i for i, v in enumerate(values) if v[name] == value), key=run_so_far))
    return chosen


def mark_exhaustive(items: list, marker) -> None:
    """Mark ``exhaustive`` the cases of each test marked ``spread`` that the quick tier leaves out."""
    tests: dict[tuple, list] = {}
    for item in items:
        if (spread := item.get_closest_marker("spread")) is not None and hasattr(item, "callspec"):
            tests.setdefault((item.path, item.originalname, spread.args), []).append(item)
    for (_, _, spread), cases in tests.items():
        cases.sort(key=lambda c: tuple(c.callspec.indices.values()))  # the order of the parametrisation, whatever
        for item, keep in zip(cases, quick([c.callspec.params for c in cases], spread)):
            if not keep:
                item.add_marker(marker)
