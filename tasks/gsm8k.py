"""GSM8K: grade-school math with chain-of-thought; exact match of the final number.

Prompt and extraction follow lm-evaluation-harness's ``gsm8k`` task: a few
"Question: ... Answer: ..." exemplars from the train split, then the
question; the answer is read two ways, as that task does: strict (the number
after ``####``) and flexible (the last number in the output).
"""

from __future__ import annotations

import random
import re
from pathlib import Path

from .base import Example, Task, TaskError, hub_rows, read_jsonl, register_task

STRICT = re.compile(r"#### (\-?[0-9\.\,]+)")
FLEXIBLE = re.compile(r"(-?[$0-9.,]{2,})|(-?[0-9]+)")


def normalise(number: str | None) -> str | None:
    if number is None:
        return None
    number = number.replace(",", "").replace("$", "").strip()
    return number[:-1] if number.endswith(".") else number


def strict_answer(text: str) -> str | None:
    match = STRICT.search(text)
    return normalise(match.group(1)) if match else None


def flexible_answer(text: str) -> str | None:
    found = [a or b for a, b in FLEXIBLE.findall(text)]
    return normalise(found[-1]) if found else None


@register_task("gsm8k")
class GSM8K(Task):
    stop = ["Question:", "</s>", "<|im_end|>", "\n\n\n"]
    chat_stop = ["Question:"]
    local = "gsm8k/test.jsonl"
    hub = ("openai/gsm8k", "main", "test")
    metrics = ["exact_match_strict", "exact_match_flexible"]

    def default_shots(self) -> int:
        return 5

    def __init__(self, shots: int | None = None):
        super().__init__(shots)
        self._data_dir = None

    def load(self, size="tiny", data_dir=None, seed=0):
        self._data_dir = data_dir
        return super().load(size, data_dir, seed)

    def exemplars(self) -> list[dict]:
        if self.shots == 0:
            return []
        tried: list[str] = []
        rows = None
        if self._data_dir is not None:
            path = Path(self._data_dir).expanduser() / "gsm8k/train.jsonl"
            if path.is_file():
                rows = read_jsonl(path)
            else:
                tried.append(f"local: {path} not found")
        if rows is None:
            rows = hub_rows("openai/gsm8k", "main", "train", tried)
        if rows is None:
            raise TaskError("gsm8k few-shot exemplars need the train split: " + "; ".join(tried))
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
