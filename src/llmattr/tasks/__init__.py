"""Tasks: prompt recipes, label words and dataset loaders of the papers (docs/tasks.md)."""

from __future__ import annotations

from ..errors import LlmattrError
from .base import BUILTIN, Task
from .catalog import PAPER_TASKS

TASKS: dict[str, Task] = {**BUILTIN, **PAPER_TASKS}


def register_task(task: Task) -> Task:
    TASKS[task.name] = task
    return task


def get_task(name: str | Task) -> Task:
    """A task by name (``sentiment``, ``boolq``, ``generate``, ``sst2``, ``blimp-darn``, ...)."""
    if isinstance(name, Task):
        return name
    if name not in TASKS:
        raise LlmattrError(f"unknown task {name!r}; valid: {', '.join(sorted(TASKS))}")
    return TASKS[name]


from .datasets import few_shot, load_examples, load_split  # noqa: E402  (datasets imports get_task)

__all__ = ["Task", "TASKS", "get_task", "register_task", "load_examples", "load_split", "few_shot"]
