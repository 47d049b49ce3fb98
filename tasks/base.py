"""What a benchmark is: load a split, build prompts, score outputs. Nothing about decoding.

A task is a class registered by name with ``@register_task("name")``; dropping
a module into ``tasks/`` registers its tasks (see ``template.py``).

Splits are tried from three sources, in this order, each named in the error
if all fail: data a package ships, a local directory (``data_dir``, laid out
like the project's shared ``data/`` folder), the Hugging Face hub through
``datasets`` (only when online).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from pipeline.errors import UserError
from pipeline.files import read_jsonl
from pipeline.hub import offline


class TaskError(UserError):
    """A user's mistake about a task, its size or its data, said in one line."""


class HubSkipped(TaskError):
    """A split would come from the hub, which a local check does not try (it is tried when the job runs)."""


@dataclass
class Example:
    id: str
    prompt: str  # the raw (non-chat) prompt
    reference: Any = None
    meta: dict[str, Any] = field(default_factory=dict)
    messages: list[dict[str, str]] | None = None  # the chat form, when it differs from [user: prompt]


class Task:
    name: ClassVar[str] = ""
    stop: ClassVar[list[str]] = []  # stop strings for raw prompts
    chat_stop: ClassVar[list[str]] = []  # stop strings with a chat template
    local: ClassVar[str | None] = None  # path of the split under data_dir
    hub: ClassVar[tuple[str, str | None, str] | None] = None  # (dataset, config, split)

    def __init__(self, shots: int | None = None):
        self.shots = self.default_shots() if shots is None else shots
        self.data_dir: str | Path | None = None
        self.allow_hub = True  # False: local sources only (a check before a run)

    def default_shots(self) -> int:
        return 0

    # ---- data ---------------------------------------------------------------------------

    def package_rows(self) -> list[dict] | None:
        """Rows from data a package ships (None: no such package)."""
        return None

    def hub_rows(self, dataset: str, config: str | None, split: str, tried: list[str]) -> list[dict] | None:
        if not self.allow_hub and not offline():  # offline, the job would find nothing there either
            raise HubSkipped(f"{self.name}: {dataset} would come from the hub")
        return hub_rows(dataset, config, split, tried)

    def rows(self, data_dir: str | Path | None) -> list[dict]:
        tried: list[str] = []
        try:
            rows = self.package_rows()
        except ImportError as err:
            rows, _ = None, tried.append(f"package: {err}")
        if rows is not None:
            return rows
        if self.local is not None:
            if data_dir is not None:
                path = Path(data_dir).expanduser() / self.local
                if path.is_file():
                    return read_jsonl(path)
                tried.append(f"local: {path} not found")
            else:
                tried.append("local: no data_dir given")
        if self.hub is not None:
            rows = self.hub_rows(*self.hub, tried)
            if rows is not None:
                return rows
        raise TaskError(f"no data for task {self.name!r}: " + "; ".join(tried))

    def examples(self, rows: list[dict]) -> list[Example]:
        raise NotImplementedError

    def load(
        self, size: str | int = "tiny", data_dir: str | Path | None = None, seed: int = 0, hub: bool = True
    ) -> list[Example]:
        """The split's examples at ``size``; ``hub=False`` tries the local sources only."""
        self.data_dir = data_dir
        self.allow_hub = hub
        return self.choose(self.examples(self.rows(data_dir)), size, seed)

    def choose(self, examples: list[Example], size: str | int, seed: int) -> list[Example]:
        """The examples a run at ``size`` takes (``select``; a task whose examples fall in categories may spread
        them over the categories instead)."""
        return select(examples, size, seed, self.name)

    def other_split(self, local: str, hub: tuple[str, str | None, str], purpose: str) -> list[dict]:
        """Another split of the benchmark (few-shot exemplars, say), from the local data or the hub."""
        tried: list[str] = []
        if self.data_dir is not None:
            path = Path(self.data_dir).expanduser() / local
            if path.is_file():
                return read_jsonl(path)
            tried.append(f"local: {path} not found")
        rows = self.hub_rows(*hub, tried)
        if rows is None:
            raise TaskError(f"{self.name} {purpose} need the {hub[2]} split: " + "; ".join(tried))
        return rows

    # ---- prompts and scoring ------------------------------------------------------------

    def chat_messages(self, example: Example) -> list[dict[str, str]]:
        return example.messages or [{"role": "user", "content": example.prompt}]

    def score(self, example: Example, output: str) -> dict[str, float]:
        raise NotImplementedError

    def aggregate(self, scores: list[dict[str, float]], ids: list[str]) -> dict[str, float]:
        """Mean of every metric over the samples that have it (``ids``: each score's example, for
        metrics over repeated samples of one example)."""
        keys = sorted({k for s in scores for k, v in s.items() if v is not None})
        return {
            k: sum(s[k] for s in scores if s.get(k) is not None) / sum(s.get(k) is not None for s in scores)
            for k in keys
        }


TASKS: dict[str, type[Task]] = {}


def register_task(name: str) -> Callable[[type[Task]], type[Task]]:
    def decorator(cls: type[Task]) -> type[Task]:
        if name in TASKS and TASKS[name] is not cls:
            raise TaskError(f"task {name!r} is registered twice")
        cls.name = name
        TASKS[name] = cls
        return cls

    return decorator


def get_task(name: str, shots: int | None = None) -> Task:
    if name not in TASKS:
        raise TaskError(f"unknown task {name!r}; accepted: {', '.join(sorted(TASKS))}")
    return TASKS[name](shots=shots)


def select(examples: list[Example], size: str | int, seed: int, task: str) -> list[Example]:
    """``tiny``: the first 5; ``small``: 200 after a seeded shuffle; ``full``; an int N: N after the shuffle."""
    n = len(examples)
    if size == "tiny":
        return examples[:5]
    if size == "full":
        return examples
    if size == "small":
        count = 200
    elif isinstance(size, int) and not isinstance(size, bool) and size > 0:
        count = size
    else:
        raise TaskError(f"size={size!r} for task {task!r}: expected tiny, small, full or a positive int")
    if count > n:
        raise TaskError(f"size={size!r} for task {task!r}: the split has only {n} examples")
    shuffled = examples[:]
    random.Random(seed).shuffle(shuffled)
    return shuffled[:count]


def hub_rows(dataset: str, config: str | None, split: str, tried: list[str]) -> list[dict] | None:
    if offline():
        tried.append(f"hub: {dataset} (offline)")
        return None
    try:
        import datasets
    except ImportError:
        tried.append(f"hub: {dataset} (the 'datasets' package is not installed)")
        return None
    try:
        return [dict(r) for r in datasets.load_dataset(dataset, config, split=split)]
    except Exception as err:  # network, missing dataset: reported with the other sources
        tried.append(f"hub: {dataset} ({type(err).__name__})")
        return None


def cut_at_stops(text: str, stops: list[str]) -> str:
    """The text up to the first stop string."""
    cut = min((i for i in (text.find(s) for s in stops) if i >= 0), default=len(text))
    return text[:cut]


def render(task: Task, example: Example, tokenizer: Any = None, chat: bool = False) -> tuple[str, list[str]]:
    """The prompt text and stop strings, through the model's chat template when asked and available."""
    if chat and tokenizer is not None and getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template(task.chat_messages(example), tokenize=False, add_generation_prompt=True)
        return text, list(task.chat_stop)
    return example.prompt, list(task.stop)
