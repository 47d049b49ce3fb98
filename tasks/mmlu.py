"""MMLU: four-choice questions; accuracy of the letter the model gives as its final answer."""

from __future__ import annotations

import re
from collections import defaultdict

from .base import Example, Task, register_task

LETTERS = "ABCD"
# the model's stated answer, most explicit first; never the first stray capital letter
ANSWER_PATTERNS = [
    re.compile(r"answer is:?\s*\(?\**([ABCD])\b", re.I),
    re.compile(r"answer:\s*\(?\**([ABCD])\b", re.I),
    re.compile(r"^\s*\(?([ABCD])(?:[\s.:)]|$)"),
    re.compile(r"\(([ABCD])\)"),
]


def extract_letter(output: str) -> str | None:
    for pattern in ANSWER_PATTERNS:
        found = pattern.findall(output)
        if found:
            return found[-1].upper() if pattern is not ANSWER_PATTERNS[2] else found[0].upper()
    return None


def format_question(row: dict) -> str:
    choices = "".join(f"\n{letter}. {choice}" for letter, choice in zip(LETTERS, row["choices"]))
    return f"{row['question'].strip()}{choices}\nAnswer:"


@register_task("mmlu")
class MMLU(Task):
    stop = ["\n\n", "Question:"]
    chat_stop: list[str] = []
    local = "mmlu/validation.jsonl"  # the test split is not shipped locally
    hub = ("cais/mmlu", "all", "test")

    def default_shots(self) -> int:
        return 5

    def dev_by_subject(self) -> dict[str, list[dict]]:
        by_subject: dict[str, list[dict]] = defaultdict(list)
        if self.shots:
            for r in self.other_split("mmlu/dev.jsonl", ("cais/mmlu", "all", "dev"), "few-shot exemplars"):
                by_subject[r["subject"]].append(r)
        return by_subject

    def examples(self, rows: list[dict]) -> list[Example]:
        dev = self.dev_by_subject()
        out = []
        for i, r in enumerate(rows):
            subject = r["subject"].replace("_", " ")
            shots = "".join(f"{format_question(d)} {LETTERS[d['answer']]}\n\n" for d in dev[r["subject"]][: self.shots])
            head = f"The following are multiple choice questions (with answers) about {subject}.\n\n"
            ask = (
                f"{head}{format_question(r).removesuffix('Answer:')}\n"
                "Think briefly, then end with 'The answer is (X)' where X is A, B, C or D."
            )
            out.append(
                Example(
                    id=f"mmlu/{i}",
                    prompt=f"{head}{shots}{format_question(r)}",
                    reference=LETTERS[r["answer"]],
                    meta={"subject": r["subject"]},
                    messages=[{"role": "user", "content": ask}],
                )
            )
        return out

    def score(self, example: Example, output: str) -> dict[str, float]:
        return {"acc": float(extract_letter(output) == example.reference)}
