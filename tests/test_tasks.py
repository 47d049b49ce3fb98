"""Benchmarks: loading, sizes, prompts, scoring on known answers, and the clear errors."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from pipeline import cli
from tasks import TASKS, TaskError, get_task, render
from tasks.cnndm import rouge
from tasks.gsm8k import flexible_answer, strict_answer
from tasks.humaneval import pass_at_k
from tasks.mmlu import extract_letter

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
needs_data = pytest.mark.skipif(not DATA.is_dir(), reason=f"the shared benchmark data is not at {DATA}")


def test_registry_has_every_benchmark():
    assert {"humaneval", "gsm8k", "mmlu", "cnndm", "spec_bench"} <= set(TASKS)
    with pytest.raises(TaskError, match="unknown task 'squad'; accepted: cnndm, gsm8k"):
        get_task("squad")


def test_template_registers_a_task_by_import():
    import tasks.template  # noqa: F401  (copying the file into tasks/ does this at package import)

    assert "my_task" in TASKS
    TASKS.pop("my_task")


def test_humaneval_from_the_package_and_sizes():
    task = get_task("humaneval")
    assert len(task.load("full")) == 164
    tiny = task.load("tiny")
    assert [e.id for e in tiny] == [f"HumanEval/{i}" for i in range(5)]
    assert tiny[0].prompt.startswith("from typing import List") and '"""' in tiny[0].prompt
    assert len(task.load(100, seed=1)) == 100
    assert task.load(100, seed=1) != task.load(100, seed=2)
    with pytest.raises(TaskError, match="size='small' for task 'humaneval': the split has only 164 examples"):
        task.load("small")
    with pytest.raises(TaskError, match="size=500 .* only 164"):
        task.load(500)
    with pytest.raises(TaskError, match="expected tiny, small, full or a positive int"):
        task.load("medium")


@pytest.mark.integration  # 204 programs through the sandbox (tests/test_sandbox.py keeps it in make test)
def test_humaneval_canonical_solutions_pass_and_shuffled_ones_fail():
    task = get_task("humaneval")
    examples = task.load("full")
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(2) as pool:
        right = list(pool.map(lambda e: task.score(e, e.reference["canonical"])["pass@1"], examples))
        wrong = list(
            pool.map(lambda i: task.score(examples[i], examples[i + 1].reference["canonical"])["pass@1"], range(0, 40))
        )
    assert sum(right) == 164
    assert sum(wrong) == 0


def test_humaneval_chat_answer_with_a_whole_function():
    task = get_task("humaneval")
    ex = task.load("tiny")[0]
    answer = f"Sure:\n```python\n{ex.prompt}{ex.reference['canonical']}```\nDone."
    assert task.score(ex, answer)["pass@1"] == 1.0
    assert pass_at_k(10, 3, 1) == pytest.approx(0.3) and pass_at_k(5, 5, 3) == 1.0


@needs_data
def test_gsm8k_prompt_and_extraction():
    task = get_task("gsm8k")
    examples = task.load("small", DATA)
    assert len(examples) == 200
    ex = task.load("tiny", DATA)[0]
    assert ex.prompt.count("Question:") == 6 and ex.prompt.endswith("Answer:") and ex.reference == "18"
    assert strict_answer("so 9 * 2 = 18.\n#### 18") == "18" and flexible_answer("She makes $1,018.") == "1018"
    assert task.score(ex, " 16 - 3 - 4 = 9 eggs, 9 * 2 = $18.\n#### 18") == {
        "exact_match_strict": 1.0,
        "exact_match_flexible": 1.0,
    }
    assert task.score(ex, " She makes 18 dollars, not 20") == {"exact_match_strict": 0.0, "exact_match_flexible": 0.0}
    assert task.score(ex, " She makes 20 - 2 = 18") == {"exact_match_strict": 0.0, "exact_match_flexible": 1.0}
    with pytest.raises(TaskError, match="size=5000 for task 'gsm8k': the split has only 1319"):
        task.load(5000, DATA)


def test_missing_data_names_every_source(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(
        TaskError, match=r"no data for task 'gsm8k': local: no data_dir given; hub: openai/gsm8k \(offline\)"
    ):
        get_task("gsm8k").load("tiny")
    import tasks.spec_bench

    monkeypatch.setattr(tasks.spec_bench, "SHIPPED", tasks.spec_bench.SHIPPED.with_name("gone.jsonl"))
    with pytest.raises(TaskError, match="spec_bench.* not found"):
        get_task("spec_bench").load("tiny", "/nonexistent")


@needs_data
def test_mmlu_prompt_and_letter_extraction():
    task = get_task("mmlu")
    ex = task.load("tiny", DATA)[0]
    assert ex.prompt.count("\nAnswer:") == 6 and ex.prompt.endswith("Answer:")
    assert ex.prompt.startswith(
        f"The following are multiple choice questions (with answers) about {ex.meta['subject'].replace('_', ' ')}"
    )
    cases = {
        " B": "B",
        "The answer is (C).": "C",
        "Answer: D": "D",
        "(A) because": "A",
        "Considering Every option, I believe the answer is B": "B",
        "I am not sure.": None,
    }
    for text, letter in cases.items():
        assert extract_letter(text) == letter, text
    gold = ex.reference
    assert task.score(ex, f" {gold}")["acc"] == 1.0
    assert task.score(ex, " " + next(x for x in "ABCD" if x != gold))["acc"] == 0.0


@needs_data
def test_cnndm_offline_and_rouge(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    task = get_task("cnndm")
    examples = task.load("full", DATA)
    assert len(examples) == 80 and examples[0].prompt.count("Article:") == 2
    assert examples[0].reference is None and task.score(examples[0], "anything") == {}
    assert rouge("the cat sat on the mat", "the cat sat on the mat")["rougeL"] == pytest.approx(1.0)
    assert rouge("a dog barked", "the cat sat on the mat")["rouge1"] == 0.0


@needs_data
def test_spec_bench_categories():
    examples = get_task("spec_bench").load("full", DATA)
    assert len(examples) == 480
    counts = Counter(e.meta["category"] for e in examples)
    assert counts == {c: 80 for c in ("mt_bench", "translation", "summarization", "qa", "math_reasoning", "rag")}
    assert len({e.meta["subcategory"] for e in examples if e.meta["category"] == "mt_bench"}) == 8


def test_spec_bench_ships_with_the_project_and_spreads_a_size_over_its_six_categories():
    """A fresh clone runs Spec-Bench offline: its 480 questions ship in tasks/data/spec_bench with the Apache-2.0
    licence beside them (the same bytes as the shared copy where one is present); N prompts are spread evenly over
    the categories in Spec-Bench's order, seeded; tiny is the first of each."""
    import hashlib

    from tasks.spec_bench import CATEGORIES, SHIPPED

    assert "Apache License" in (SHIPPED.parent / "LICENSE").read_text()[:200]
    digest = hashlib.sha256(SHIPPED.read_bytes()).hexdigest()
    assert digest in (SHIPPED.parent / "README.md").read_text()
    if (DATA / "spec_bench" / "question.jsonl").is_file():
        assert (DATA / "spec_bench" / "question.jsonl").read_bytes() == SHIPPED.read_bytes()
    task = get_task("spec_bench")
    assert len(task.load("full")) == 480
    twelve = task.load(12, seed=1)
    assert [e.meta["category"] for e in twelve] == list(CATEGORIES) * 2
    assert [e.id for e in task.load(12, seed=1)] == [e.id for e in twelve]  # seeded
    assert [e.id for e in task.load(12, seed=2)] != [e.id for e in twelve]
    assert [e.meta["category"] for e in task.load("tiny")] == list(CATEGORIES)
    assert Counter(e.meta["category"] for e in task.load(200)) == dict(zip(CATEGORIES, [34, 34, 33, 33, 33, 33]))
    with pytest.raises(TaskError, match=r"size=481 for task 'spec_bench': the split has only 480 examples"):
        task.load(481)


def test_chat_template_rendering():
    from transformers import AutoTokenizer

    from pipeline.models import bundled_dir

    tok = AutoTokenizer.from_pretrained(bundled_dir())
    task = get_task("humaneval")
    ex = task.load("tiny")[0]
    text, stops = render(task, ex, tok, chat=True)
    assert "<|im_start|>user" in text and "```python" in text and stops == []
    raw, stops = render(task, ex, tok, chat=False)
    assert raw == ex.prompt and "\ndef " in stops


@needs_data
def test_score_command(tmp_path, capsys):
    gens = tmp_path / "gsm8k.jsonl"
    gens.write_text(
        json.dumps({"id": "gsm8k/0", "output": " #### 18"})
        + "\n"
        + json.dumps({"id": "gsm8k/1", "output": " #### 7"})
        + "\n"
    )
    assert cli.main(["score", str(gens), "--task", "gsm8k", "--data-dir", str(DATA)]) == 0
    summary = json.loads((tmp_path / "gsm8k.summary.json").read_text())
    assert summary["exact_match_strict"] == 0.5 and summary["samples"] == 2
    assert len((tmp_path / "gsm8k.scores.jsonl").read_text().splitlines()) == 2
    gens.write_text(json.dumps({"id": "nope", "output": ""}) + "\n")
    assert cli.main(["score", str(gens), "--task", "gsm8k", "--data-dir", str(DATA)]) == 2
    assert "ids of gsm8k.jsonl are not in task 'gsm8k'" in capsys.readouterr().err


def test_a_dataset_is_one_file_copied_from_the_template(tmp_path):
    """docs/extending.md: a dataset is `tasks/template.py` copied into `tasks/` and listed under `datasets:`. In a
    copy of the project with one such file and nothing else edited, the task loads its split, scores an answer,
    and a config that lists it expands into cells of it."""
    import shutil
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    for part in ("pipeline", "tasks", "workflow", "config"):
        shutil.copytree(root / part, tmp_path / part, ignore=shutil.ignore_patterns("__pycache__"))
    (tmp_path / "tasks" / "quiz.py").write_text((root / "tasks" / "template.py").read_text().replace("my_task", "quiz"))
    data = tmp_path / "data" / "quiz"
    data.mkdir(parents=True)
    rows = [{"question": f"{i} + 1?", "answer": str(i + 1)} for i in range(6)]
    (data / "test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    probe = (
        "from tasks import get_task\n"
        "from pipeline.experiment.config import check_config\n"
        "from pipeline.experiment.config_file import load_config_file\n"
        "from pipeline.experiment.grid import expand_cells\n"
        "task = get_task('quiz')\n"
        "ex = task.load(3, data_dir='data', hub=False)\n"
        "assert len(ex) == 3 and task.score(ex[0], ' ' + ex[0].reference)['exact_match'] == 1.0\n"
        "config = load_config_file('config/default.yaml')\n"
        "config['data_dir'] = 'data'\n"
        "config['datasets'] = {'quiz': {'size': 3}}\n"
        "for grid in config['grids']:\n"
        "    grid.pop('datasets', None)\n"
        "cells = expand_cells(check_config(config))\n"
        "print(sorted({c.cell.task for c in cells.values()}))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], cwd=tmp_path, capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "['quiz']"
