"""Spec-Bench (Xia et al. 2024, "Unlocking Efficiency in Large Language Model Inference: A Comprehensive Survey of
Speculative Decoding"): 480 questions in six categories for speculative-decoding speed, shipped with the project
(``data/spec_bench/``, Apache-2.0, its licence beside it), so a fresh clone runs it offline.

Quality is not scored: the benchmark measures speed, reported per category (Spec-Bench's six: the 80 MT-bench
questions, whose own eight categories are kept as ``subcategory``, translation, summarization, question answering,
mathematical reasoning, retrieval-augmented generation) and over all of them (its Overall: every prompt pooled).
Multi-turn questions use their first turn. A size of N prompts is spread evenly over the six categories (a seeded
shuffle within each, then one category after another in ``CATEGORIES``' order), so a few prompts still cover every
category; ``tiny`` is the first question of each.
"""

from __future__ import annotations

import random
from pathlib import Path

from pipeline.files import read_jsonl

from .base import Example, Task, TaskError, register_task, select

MT_BENCH = {"writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities"}
CATEGORIES = ("mt_bench", "translation", "summarization", "qa", "math_reasoning", "rag")  # Spec-Bench's order
SHIPPED = Path(__file__).resolve().parent / "data" / "spec_bench" / "question.jsonl"


@register_task("spec_bench")
class SpecBench(Task):
    stop: list[str] = []
    chat_stop: list[str] = []
    local = "spec_bench/question.jsonl"

    def package_rows(self) -> list[dict] | None:
        return read_jsonl(SHIPPED) if SHIPPED.is_file() else None

    def examples(self, rows: list[dict]) -> list[Example]:
        return [
            Example(
                id=f"spec_bench/{r['question_id']}",
                prompt=r["turns"][0] + "\n",
                meta={
                    "category": "mt_bench" if r["category"] in MT_BENCH else r["category"],
                    "subcategory": r["category"],
                    "turns": len(r["turns"]),
                },
            )
            for r in rows
        ]

    def choose(self, examples: list[Example], size: str | int, seed: int) -> list[Example]:
        """``size`` prompts spread evenly over the categories (see the module's docstring)."""
        if size == "full":
            return examples
        by_category: dict[str, list[Example]] = {c: [] for c in CATEGORIES}
        for ex in examples:
            by_category.setdefault(ex.meta["category"], []).append(ex)
        if size == "tiny":
            return [group[0] for group in by_category.values() if group]
        count = len(select(examples, size, seed, self.name))  # checks the size as every task does
        for group in by_category.values():
            random.Random(seed).shuffle(group)
        order = [group[k] for k in range(max(map(len, by_category.values()))) for group in by_category.values()
                 if k < len(group)]
        if count > len(order):
            raise TaskError(f"size={size!r} for task {self.name!r}: the split has only {len(order)} examples")
        return order[:count]

    def score(self, example: Example, output: str) -> dict[str, float]:
        return {}
