"""The sandbox contains hostile completions: none passes, none leaves a trace, later samples are unharmed.

The attacks (``sandbox_attacks.py``) run through a scorer in its own process,
as root (when the tests run as root) and as an unprivileged uid (the tests' own
when they do not), so that both ways bubblewrap is started are faced.
"""

from __future__ import annotations

import json
import math
import os
import shutil

import pytest

from tasks import get_task
from tasks import sandbox as sb
from tasks.sandbox import BUBBLEWRAP, GUARD_ONLY, run_tests
from tasks.sandbox_child import Opaque, decode, encode

from .sandbox_attacks import (
    ATTACKS,
    PRINT_1GB,
    RIGHT,
    SLOW_RIGHT,
    THREADED,
    UNPRIVILEGED,
    attack_code,
    completion,
    make_canaries,
    new_token,
    remove,
    score,
    scorer_python,
    traces,
)

IS_ROOT = os.geteuid() == 0
needs_bwrap = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")
SCORERS = ["root", "non-root"]


@pytest.fixture(scope="module")
def problem():
    task = get_task("humaneval")
    return task, task.load("full")[0]  # HumanEval/0, has_close_elements


def scorer_user(who: str) -> int | None:
    """The uid to score as: None for this process's own."""
    if who == "root":
        if not IS_ROOT:
            pytest.skip("the tests do not run as root")
        return None
    if IS_ROOT and scorer_python(UNPRIVILEGED) is None:
        pytest.skip("no Python interpreter an unprivileged uid can start")
    return UNPRIVILEGED if IS_ROOT else None


def run_of(problem, code: str, isolation: str = BUBBLEWRAP, **limits) -> dict:
    task, example = problem
    return {**task.sandbox_run(example, completion(code)), "isolation": isolation, **limits}


@needs_bwrap
@pytest.mark.parametrize("who", SCORERS)
def test_every_attack_is_contained(problem, who):
    user = scorer_user(who)
    canaries, token = make_canaries(user), new_token()
    try:
        runs = [run_of(problem, attack_code(a, canaries, token), timeout_s=3, memory_mb=512) for a in ATTACKS.values()]
        out = score([*runs, run_of(problem, RIGHT)], user)
        left = traces(token, canaries)
    finally:
        remove(canaries, token)
    results = dict(zip([*ATTACKS, "a later correct sample"], out["results"]))
    assert not [name for name in ATTACKS if results[name]["passed"]], "forged verdicts"
    assert not left, "escapes"
    assert results["a later correct sample"]["passed"], results["a later correct sample"]
    assert not [name for name, r in results.items() if r["seconds"] > 8], "runs past their limits"
    assert results["infinite loop"]["status"] == "timeout"


@needs_bwrap
@pytest.mark.parametrize("who", SCORERS)
def test_kill_minus_one_spares_other_samples(problem, who):
    killer = "import posix, time\nend = time.time() + 3\nwhile time.time() < end:\n    posix.kill(-1, 9)\n"
    runs = [run_of(problem, killer, timeout_s=6), run_of(problem, SLOW_RIGHT), run_of(problem, SLOW_RIGHT)]
    out = score(runs, scorer_user(who), workers=3)
    assert [r["passed"] for r in out["results"]] == [False, True, True], out["results"]


@needs_bwrap
@pytest.mark.parametrize("who", SCORERS)
def test_a_1gb_print_keeps_the_scorer_small(problem, who):
    out = score([run_of(problem, PRINT_1GB, timeout_s=60)], scorer_user(who))
    (result,) = out["results"]
    assert result["passed"], result
    assert result["output_bytes"] >= 1 << 30 and result["output_kept"] <= 1 << 20
    assert out["scorer_mb"] < 200 and out["children_mb"] < 200, out


@pytest.mark.parametrize("isolation", [BUBBLEWRAP, GUARD_ONLY])
@pytest.mark.parametrize("who", SCORERS)
def test_a_correct_threaded_program_passes(problem, who, isolation):
    if isolation == BUBBLEWRAP and shutil.which("bwrap") is None:
        pytest.skip("bubblewrap is not installed")
    (result,) = score([run_of(problem, THREADED, isolation)], scorer_user(who))["results"]
    assert result["passed"], result


GUARD_BATTERY = [  # what the interpreter guard alone is for: model mistakes, and the verdict channel
    "harness success path",
    "every finish() in sys.modules",
    "sys.exit(0) before the tests",
    "os._exit(0) before the tests",
    "patched failure hooks",
    "caller frames",
    "a passing verdict on every descriptor",
    "an always-equal result",
    "fork bomb",
    "memory bomb",
    "infinite loop",
]


def test_guard_only_fails_mistakes_and_forgeries(problem):
    canaries, token = make_canaries(None), new_token()
    try:
        for name in GUARD_BATTERY:
            code = attack_code(ATTACKS[name], canaries, token)
            result = run_tests(**run_of(problem, code, GUARD_ONLY, timeout_s=3, memory_mb=512))
            assert not result.passed, name
            assert result.seconds < 8, f"{name} outlived its limits"
        rm = "import os, shutil\n" + "".join(f"os.system('rm -rf {c}')\nshutil.rmtree('{c}')\n" for c in canaries)
        assert not run_tests(**run_of(problem, rm, GUARD_ONLY)).passed
        assert not traces(token, canaries)
    finally:
        remove(canaries, token)


@pytest.mark.parametrize("isolation", [BUBBLEWRAP, GUARD_ONLY])
def test_ordinary_programs_and_their_failures(isolation):
    if isolation == BUBBLEWRAP and shutil.which("bwrap") is None:
        pytest.skip("bubblewrap is not installed")
    ok = run_tests(
        "import math\nopen('scratch', 'w').write('x')\ndef f(x):\n    print('hello')\n    return math.gcd(x, 6)\n",
        "assert f(4) == 2\n",
        "f",
        isolation=isolation,
    )
    assert ok.passed and ok.output == "hello\n", ok
    wrong = run_tests("def f():\n    return 1\n", "assert f() == 2, 'wrong'\n", "f", isolation=isolation)
    assert not wrong.passed and wrong.detail == "AssertionError: wrong"
    raises = "def f():\n    raise ValueError('no')\n"
    expects = "try:\n    f()\nexcept ValueError as e:\n    assert str(e) == 'no'\nelse:\n    raise AssertionError\n"
    assert run_tests(raises, expects, "f", isolation=isolation).passed
    broken = run_tests("def f(:\n", "f()\n", "f", isolation=isolation)
    assert not broken.passed and broken.detail.startswith("SyntaxError")


def test_plain_values_cross_the_pipes_and_nothing_else():
    values = [
        None,
        True,
        0,
        -(10**40),
        1.5,
        math.inf,
        "é",
        [1, (2, 3)],
        {1: {"a": frozenset({4})}},
        {5},
        b"\0",
        complex(1, -2),
        (),
    ]
    for value in values:
        assert decode(json.loads(json.dumps(encode(value)))) == value
        assert type(decode(encode(value))) is type(value)
    assert math.isnan(decode(encode(math.nan)))

    class Sneaky(int):
        def __eq__(self, other):
            return True

    assert type(decode(encode(Sneaky(3)))) is int and decode(encode(Sneaky(3))) != 4
    assert isinstance(decode(encode(object())), Opaque) and decode(encode(object())) != decode(encode(object()))
    for junk in ({"eval": "1"}, {"list": 1}, {"a": 1, "b": 2}, {"dict": [[1]]}, [1]):
        with pytest.raises(ValueError):
            decode(junk)


def test_without_bubblewrap_one_line_and_guard_only_in_the_summary(tmp_path, monkeypatch, capsys):
    from pipeline.job.scoring import score_file

    monkeypatch.setenv("PATH", str(tmp_path))  # no bwrap on it
    monkeypatch.setattr(sb, "_chosen", None)
    assert sb.sandbox_isolation() == GUARD_ONLY
    assert sb.sandbox_isolation() == GUARD_ONLY
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "bubblewrap (bwrap) is not installed" in err and "guard-only" in err
    example = get_task("humaneval").load("full")[0]
    gens = tmp_path / "humaneval.jsonl"
    gens.write_text(json.dumps({"id": example.id, "output": example.reference["canonical"]}) + "\n")
    summary = score_file(gens, "humaneval")
    assert summary["isolation"] == GUARD_ONLY and summary["pass@1"] == 1.0


@needs_bwrap
def test_with_bubblewrap_the_summary_says_so(tmp_path, monkeypatch):
    from pipeline.job.scoring import score_file

    monkeypatch.setattr(sb, "_chosen", None)
    example = get_task("humaneval").load("full")[0]
    gens = tmp_path / "humaneval.jsonl"
    gens.write_text(json.dumps({"id": example.id, "output": "    return True\n"}) + "\n")
    summary = score_file(gens, "humaneval")
    assert summary["isolation"] == BUBBLEWRAP and summary["pass@1"] == 0.0
