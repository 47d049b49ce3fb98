"""Before any job: does every cell's longest prompt plus ``max_new_tokens`` fit each of its models' context?

The prompt is rendered as the generation job renders it (the task's prompt, through the chat template
when the cell asks for it) and counted with the model's own tokenizer; the limit is
``max_position_embeddings`` from the model's ``config.json``. Models whose directory is not on this machine
yet (fetched, converted or distilled by ``prepare``) and datasets that come from the hub are checked by
the decoder itself when the job runs (``generate`` refuses the same before its first forward).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import UserError

if TYPE_CHECKING:
    from ..models import ModelSpec
    from .cell import CellFile


def model_dir(spec: ModelSpec) -> Path | None:
    """The local directory of a model when it is already here (a local directory or a prepared cache
    entry), else None."""
    from ..models import BUNDLED, ModelError, locate
    from ..models.cache import cache_dir

    try:
        kind, where = locate(spec)
    except ModelError:
        return None  # the config check names it
    if kind in ("bundled", "gguf"):  # converted once into the cache
        where = cache_dir() / (BUNDLED if kind == "bundled" else spec.name)
    return Path(where) if kind != "distill" and where and (Path(where) / "config.json").is_file() else None


def context_limit(path: Path, error: type[UserError] = UserError) -> int | None:
    """``max_position_embeddings`` from ``path/config.json`` (None when it gives none)."""
    from ..files import read_user_json

    try:
        limit = read_user_json(path / "config.json", "model config").get("max_position_embeddings")
    except UserError as err:  # not JSON, past its bounds: one line naming the file
        raise error(str(err)) from None
    except AttributeError:
        raise error(f"model config {path / 'config.json'} is not a JSON object") from None
    return limit if isinstance(limit, int) and not isinstance(limit, bool) else None


def longest_prompt(task_name: str, size: Any, chat: bool, data_dir: Any, seed: int, path: Path) -> int | None:
    """The most tokens any prompt of the dataset takes under the tokenizer in ``path`` (None: hub data)."""
    from transformers import AutoTokenizer

    from tasks import HubSkipped, get_task, render

    task = get_task(task_name)
    try:
        examples = task.load(size, data_dir, seed, hub=False)
    except HubSkipped:
        return None
    tokenizer = AutoTokenizer.from_pretrained(path)
    prompts = [render(task, ex, tokenizer, chat)[0] for ex in examples]
    return max((len(ids) for ids in tokenizer(prompts).input_ids), default=0)


def check_context(cells: dict[str, CellFile], error: type[UserError] = UserError) -> None:
    """Refuse the first cell whose longest prompt plus ``max_new_tokens`` exceeds a model's
    ``max_position_embeddings``: one line, an ``error`` (the config check passes its own). Each dataset is
    rendered once per model directory."""
    longest: dict[tuple, int | None] = {}
    for cell_id, entry in cells.items():
        cell = entry.cell
        for model in cell.models:
            path = model_dir(model)
            limit = path and context_limit(path, error)
            if not limit:
                continue
            key = (cell.task, json.dumps(cell.size), cell.chat, str(path))
            if key not in longest:
                longest[key] = longest_prompt(cell.task, cell.size, cell.chat, cell.data_dir, cell.seed, path)
            prompt = longest[key]
            if prompt is not None and prompt + cell.max_new_tokens > limit:
                raise error(
                    f"cell {cell_id}: the longest {cell.task} prompt is {prompt} tokens under model "
                    f"{model.name!r}; with max_new_tokens={cell.max_new_tokens} it needs "
                    f"{prompt + cell.max_new_tokens} positions, and {model.name!r} holds {limit} "
                    "(max_position_embeddings in its config.json); lower max_new_tokens or choose another model"
                )
