"""Tasks: prompt recipes, label words and dataset loaders of the papers (docs/tasks.md)."""

from __future__ import annotations

from .base import Pairing, Task
from .catalog import TASKS, get_task, register_task
from .datasets import few_shot, load_examples, load_split

__all__ = ["Pairing", "Task", "TASKS", "get_task", "register_task", "load_examples", "load_split", "few_shot"]
