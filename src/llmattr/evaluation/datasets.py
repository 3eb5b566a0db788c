"""The datasets of ``llmattr evaluate``: a task with its sample data file, ``n`` examples, balanced, seeded."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..errors import LlmattrError
from ..tasks import TASKS, Task, get_task, load_examples
from ..tasks.blimp import PARADIGMS

GROUPS = {"blimp": tuple(f"blimp-{short}" for short in PARADIGMS)}  # paper 003 Table 3's five paradigms


@dataclass
class Dataset:
    """A named list of examples (each a dict with an ``id``) and the task that prompts them."""

    name: str
    task: Task
    examples: list[dict]


DatasetLoader = Callable[[str, int, int], Dataset]


def dataset_names() -> list[str]:
    """Tasks that name a sample data file (``sst2``, ``imdb``, ``boolq``, ...): the valid ``--datasets``."""
    return sorted(name for name, task in TASKS.items() if getattr(task, "data", None))


def expand_datasets(names: list[str]) -> list[str]:
    """``names`` with each group (``blimp``: ``blimp-ana``, ``-dna``, ``-dnaa``, ``-darn``, ``-rpsv``) replaced
    by its datasets, each once, in order."""
    return list(dict.fromkeys(member for name in names for member in GROUPS.get(name, (name,))))


def load_dataset(name: str, n: int, seed: int) -> Dataset:
    """``n`` examples of dataset ``name`` (its task's sample file in llmattr/data), balanced, seeded."""
    if name not in dataset_names():
        raise LlmattrError(f"unknown dataset {name!r}; valid: {', '.join(sorted([*dataset_names(), *GROUPS]))}")
    task = get_task(name)
    return Dataset(name, task, load_examples(task, n=n, seed=seed))
