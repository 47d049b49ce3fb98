"""GSM8K: grade-school math with chain-of-thought; exact match of the final number.

Prompt and extraction follow lm-evaluation-harness's ``gsm8k`` task: a few
"Question: ... Answer: ..." exemplars from the train split, then the
question; the answer is read two ways, as that task does: strict (the number
after ``####``) and flexible (the last number in the output).
"""

from __future__ import annotations

import random
import re

from .base import Example, Task, register_task

STRICT = re.compile(r"#### (\-?[0-9\.\,]+)")
FLEXIBLE = re.compile(r"(-?[$0-9.,]{2,})|(-?[0-9]+)")


def normalise(number: str | None) -> str | None:
    if number is None:
        return None
    number = number.replace(",", "").replace("$", "").strip()
    return number[:-1] if number.endswith(".") else number


def _extract(text: str, pattern: re.Pattern, group_select: int) -> str | None:
    """lm-eval's own regex filter where it is installed (as it is with this project), else the same rule."""
    try:
        from lm_eval.filters.extraction import RegexFilter
    except ImportError:
        found = pattern.findall(text)
        if not found:
            return None
        match = found[group_select]
        match = next((m for m in match if m), None) if isinstance(match, tuple) else match
        return normalise(match)
    (value,) = next(iter(RegexFilter(pattern.pattern, group_select).apply([[text]], [{}])))
    return None if value == "[invalid]" else normalise(value)


def strict_answer(text: str) -> str | None:
    return _extract(text, STRICT, 0)


def flexible_answer(text: str) -> str | None:
    return _extract(text, FLEXIBLE, -1)


@register_task("gsm8k")
class GSM8K(Task):
    stop = ["Question:", "</s>", "<|im_end|>", "\n\n\n"]
    chat_stop = ["Question:"]
    local = "gsm8k/test.jsonl"
    hub = ("openai/gsm8k", "main", "test")

    def default_shots(self) -> int:
        return 5

    def exemplars(self) -> list[dict]:
        if self.shots == 0:
            return []
        rows = self.other_split("gsm8k/train.jsonl", ("openai/gsm8k", "main", "train"), "few-shot exemplars")
        rows = rows[:]
        random.Random(1234).shuffle(rows)
        return rows[: self.shots]

    def examples(self, rows: list[dict]) -> list[Example]:
        context = "".join(f"Question: {r['question']}\nAnswer: {r['answer']}\n\n" for r in self.exemplars())
        return [
            Example(
                id=f"gsm8k/{i}",
                prompt=f"{context}Question: {r['question']}\nAnswer:",
                reference=strict_answer(r["answer"]),
            )
            for i, r in enumerate(rows)
        ]

    def score(self, example: Example, output: str) -> dict[str, float]:
        gold = example.reference
        return {
            "exact_match_strict": float(strict_answer(output) == gold),
            "exact_match_flexible": float(flexible_answer(output) == gold),
        }
