"""CNN/DailyMail summarisation, scored with ROUGE-1/2/L (``rouge-score``).

Sources: a local ``cnndm/test.jsonl`` (article, highlights); the hub's
``cnn_dailymail`` 3.0.0 test split; offline, the 80 CNN/DM articles of
Spec-Bench's summarization category, which come without reference summaries
(then only speed is measured and ROUGE is left empty).
"""

from __future__ import annotations

from pathlib import Path

from .base import Example, Task, TaskError, read_jsonl, register_task

# a one-shot exemplar written for this project (not taken from the dataset)
SHOT = (
    "Article: The city council voted on Tuesday to turn the old railway depot into a public library. "
    "Work will start next spring and is expected to take two years. Residents had campaigned for a "
    "library in the district for over a decade.\n"
    "Summary: The old railway depot will become a public library, with work starting next spring.\n\n"
)


def rouge(prediction: str, reference: str) -> dict[str, float]:
    from rouge_score import rouge_scorer

    scorer = rouge_scorer.RougeScorer(["rouge1", "rouge2", "rougeL"], use_stemmer=True)
    return {k: v.fmeasure for k, v in scorer.score(reference, prediction).items()}


@register_task("cnndm")
class CNNDM(Task):
    stop = ["\n\n", "Article:"]
    chat_stop: list[str] = []
    hub = ("cnn_dailymail", "3.0.0", "test")

    def default_shots(self) -> int:
        return 1

    def rows(self, data_dir):
        tried: list[str] = []
        if data_dir is not None:
            local = Path(data_dir).expanduser() / "cnndm/test.jsonl"
            if local.is_file():
                return read_jsonl(local)
            tried.append(f"local: {local} not found")
        rows = self.hub_rows(*self.hub, tried)
        if rows is not None:
            return rows
        if data_dir is not None:
            spec = Path(data_dir).expanduser() / "spec_bench/question.jsonl"
            if spec.is_file():
                return [
                    {
                        "id": f"spec_bench/{r['question_id']}",
                        "article": r["turns"][0].removeprefix("Summarize:").strip(),
                        "highlights": None,
                    }
                    for r in read_jsonl(spec)
                    if r["category"] == "summarization"
                ]
            tried.append(f"local: {spec} not found")
        raise TaskError("no data for task 'cnndm': " + "; ".join(tried))

    def examples(self, rows: list[dict]) -> list[Example]:
        shot = SHOT if self.shots else ""
        return [
            Example(
                id=str(r.get("id", i)),
                prompt=f"{shot}Article: {r['article'].strip()}\nSummary:",
                reference=r.get("highlights"),
                messages=[{"role": "user", "content": f"Summarize this article in two sentences.\n\n{r['article']}"}],
            )
            for i, r in enumerate(rows)
        ]

    def score(self, example: Example, output: str) -> dict[str, float]:
        if not example.reference:
            return {}
        return rouge(output.strip(), example.reference)
