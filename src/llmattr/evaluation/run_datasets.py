"""The datasets of ``llmattr evaluate``: a task with its sample data file, ``n`` examples, balanced, seeded."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..checks import check_texts
from ..errors import LlmattrError, unknown_name
from ..models.card import content_hash
from ..tasks import TASKS, Task, get_task, load_examples
from ..tasks.datasets import sample
from ..tasks.files import example_texts, read_file_examples


@dataclass
class Dataset:
    """A named list of examples (each a dict with an ``id``) and the task that prompts them."""

    name: str
    task: Task
    examples: list[dict]
    excluded: int = 0  # rows left out because the model was trained on them (its model card)


DatasetLoader = Callable[[str, int | None, int], Dataset]  # (name, n or None for every row, seed)
Exclude = Callable[[Task, dict, str], bool]  # (task, example, data source) -> the model was trained on it


def trained_rows(card: dict | None) -> Exclude | None:
    """What a fine-tuned model saw, from its model card (:mod:`llmattr.models.card`): a row whose user text
    hashes to a training row's, or whose id is a training id of the same data source; None without a card."""
    if not card:
        return None
    ids, hashes, source = set(card.get("train_ids", ())), set(card.get("train_hashes", ())), card["data"]["source"]

    def seen(task: Task, example: dict, data_source: str) -> bool:
        return (content_hash(task.user_content(example)[0]) in hashes
                or (data_source == source and example["id"] in ids))

    return seen


def draw(name: str, task: Task, examples: list[dict], n: int | None, seed: int, source: str,
         exclude: Exclude | None) -> Dataset:
    """``n`` examples balanced per class (None: every one), drawn with ``seed`` from those the model was not
    trained on."""
    kept = [ex for ex in examples if not exclude(task, ex, source)]
    return Dataset(name, task, sample(kept, n, seed, True, task.classes), excluded=len(examples) - len(kept))


def dataset_names() -> list[str]:
    """Tasks that name a sample data file (``sst2``, ``imdb``, ``boolq``, ...): the valid ``--datasets``."""
    return sorted(name for name, task in TASKS.items() if getattr(task, "data", None))


def dataset_groups() -> dict[str, tuple[str, ...]]:
    """Each group of datasets (``Task.group``; ``blimp``: ``blimp-ana``, ``-dna``, ``-dnaa``, ``-darn``, ``-rpsv``)
    and its datasets, in registration order."""
    groups: dict[str, list[str]] = {}
    for name, task in TASKS.items():
        if task.group and task.data:
            groups.setdefault(task.group, []).append(name)
    return {group: tuple(names) for group, names in groups.items()}


def expand_datasets(names: list[str]) -> list[str]:
    """``names`` with each group (:func:`dataset_groups`) replaced by its datasets, each once, in order."""
    groups = dataset_groups()
    return list(dict.fromkeys(member for name in names for member in groups.get(name, (name,))))


def load_dataset(name: str, n: int | None, seed: int, exclude: Exclude | None = None) -> Dataset:
    """``n`` examples of dataset ``name`` (its task's sample file in llmattr/data), balanced, seeded (None: every
    row); with
    ``exclude``, drawn from the rows it does not exclude."""
    if name not in dataset_names():
        valid = sorted([*dataset_names(), *dataset_groups()])
        raise LlmattrError(unknown_name("dataset", name, valid))
    task = get_task(name)
    if exclude is None:
        return Dataset(name, task, load_examples(task, n=n, seed=seed))
    return draw(name, task, load_examples(task, seed=seed), n, seed, task.data, exclude)


def file_dataset(path: str | Path, task: str | Task, n: int | None, seed: int, text_field: str | None = None,
                 label_field: str | None = None, labels: str | None = None,
                 exclude: Exclude | None = None) -> Dataset:
    """``n`` examples of the user's own file (:func:`llmattr.tasks.files.read_file_examples`; None: every row),
    named by its stem; an empty text is refused here, before the model loads, as ``explain --data`` does."""
    task, examples = read_file_examples(task, path, text_field, label_field, labels)
    check_texts(example_texts(task, examples), first=1, noun="row")
    return draw(Path(path).stem, task, examples, n, seed, str(path), exclude or (lambda *_: False))
