"""Benchmarks: one module per task, registered by name (see ``template.py`` to add one)."""

import importlib
import pkgutil

from .base import TASKS, Example, HubSkipped, Task, TaskError, get_task, register_task, render

for _module in pkgutil.iter_modules(__path__):
    if _module.name not in ("base", "sandbox", "template"):
        importlib.import_module(f"{__name__}.{_module.name}")

__all__ = [
    "TASKS",
    "Example",
    "HubSkipped",
    "Task",
    "TaskError",
    "get_task",
    "register_task",
    "render",
]
