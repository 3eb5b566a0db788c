"""Tasks: prompt recipes, label words and dataset loaders of the papers."""

from __future__ import annotations

from ..errors import LlmattrError
from .base import BUILTIN, Task

TASKS: dict[str, Task] = dict(BUILTIN)


def register_task(task: Task) -> Task:
    TASKS[task.name] = task
    return task


def get_task(name: str | Task) -> Task:
    """A task by name (``sentiment``, ``boolq``, ``generate``, ...)."""
    if isinstance(name, Task):
        return name
    if name not in TASKS:
        raise LlmattrError(f"unknown task {name!r}; valid: {', '.join(sorted(TASKS))}")
    return TASKS[name]


__all__ = ["Task", "TASKS", "get_task", "register_task"]
