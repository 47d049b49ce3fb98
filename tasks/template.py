"""A starting point for a new benchmark: copy this file to ``tasks/<name>.py`` and fill it in.

Every module in ``tasks/`` is imported when the package loads, so the
``@register_task`` below is all it takes for ``--task my_task`` (and the
workflow's ``datasets:`` list) to find it. This file itself is skipped.
"""

from __future__ import annotations

from .base import Example, Task, register_task


@register_task("my_task")
class MyTask(Task):
    stop = ["\n\n"]  # where a raw completion ends
    chat_stop: list[str] = []  # the same when the model's chat template is used
    local = "my_task/test.jsonl"  # the split under data_dir, one JSON object per line
    hub = None  # or ("dataset/name", "config", "split") for datasets.load_dataset

    def examples(self, rows: list[dict]) -> list[Example]:
        return [
            Example(id=f"my_task/{i}", prompt=f"Q: {r['question']}\nA:", reference=r["answer"])
            for i, r in enumerate(rows)
        ]

    def score(self, example: Example, output: str) -> dict[str, float]:
        return {"exact_match": float(output.strip() == str(example.reference).strip())}
