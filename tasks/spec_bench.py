"""Spec-Bench: 480 questions in six categories for speculative-decoding speed (local data only).

Quality is not scored: the benchmark measures speed, reported per category
(Spec-Bench's six: the 80 MT-bench questions, whose own eight categories are
kept as ``subcategory``, translation, summarization, question answering,
mathematical reasoning, retrieval-augmented generation). Multi-turn questions
use their first turn.
"""

from __future__ import annotations

from .base import Example, Task, register_task

MT_BENCH = {"writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities"}


@register_task("spec_bench")
class SpecBench(Task):
    stop: list[str] = []
    chat_stop: list[str] = []
    local = "spec_bench/question.jsonl"

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

    def score(self, example: Example, output: str) -> dict[str, float]:
        return {}
