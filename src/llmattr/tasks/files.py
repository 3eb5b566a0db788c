"""A user's own data file (JSONL, JSON list, CSV, TSV) as examples of a task.

``--data my.csv --text-field review --label-field label [--labels 0=Negative,1=Positive]``: the column
``review`` fills the task's first field (its other fields keep their names), ``label`` holds the gold label,
mapped to the task's label words by the task's own map (``positive`` -> ``Positive``) or by ``--labels``.
Every row is checked before anything heavy runs: a missing column is one line naming the columns the file has.
One reader serves ``llmattr finetune --data``, ``llmattr evaluate --data`` and ``llmattr explain --data``
(the texts alone: :func:`read_file_texts`).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from ..errors import LlmattrError
from ..model_free import file_labels, file_rows, label_text, task_facts  # noqa: F401 - label_text: its old home
from ..readers import parse_labels, row_texts, shaped_rows, shaped_texts  # noqa: F401 - parse_labels: its old home
from .base import Task
from .catalog import get_task
from .datasets import to_example


def file_task(task: str | Task, labels: str | None = None) -> Task:
    """``task`` with the label words of ``--labels`` (a classification task only)."""
    task = get_task(task)
    if labels is None:
        return task
    words, mapping = file_labels(task_facts(task), labels)
    return replace(task, label_words=words, label_map=mapping)


def read_file_texts(task: str | Task, path: str | Path, text_field: str | None = None,
                    documents_field: str | None = None) -> list[str | dict]:
    """The text of every row of ``path`` as :func:`llmattr.explain` takes it (:func:`llmattr.readers.row_texts`
    with the task's facts: :func:`llmattr.model_free.task_facts`)."""
    return row_texts(task_facts(get_task(task)), path, text_field, documents_field)


def example_texts(task: Task, examples: list[dict]) -> list[str | dict]:
    """Each example's text as :func:`llmattr.explain` takes it (:func:`llmattr.readers.shaped_texts`)."""
    return shaped_texts(task_facts(task), examples)


def read_file_examples(task: str | Task, path: str | Path, text_field: str | None = None,
                       label_field: str | None = None, labels: str | None = None) -> tuple[Task, list[dict]]:
    """The task (with ``--labels`` applied) and every row of ``path`` as one of its examples, in file order.

    Raises :class:`LlmattrError` (one line) for a missing file, an empty file, a row without the text or label
    column, or a label that is none of the label words (a regression task's: not a number), the file's columns
    before ``--labels``; the CLI calls it before any model loads (:func:`llmattr.evaluation.plan`,
    :func:`llmattr.finetuning.plan`).
    """
    path = Path(path)
    rows, where, columns = shaped_rows(task_facts(get_task(task)), path, text_field, label_field)  # the file first
    task = file_task(task, labels)
    rows, _ = file_rows(task_facts(task), path, rows, where, columns["label"])
    examples = []
    for i, (row, at) in enumerate(zip(rows, where, strict=True)):
        try:
            examples.append(to_example(task, row, i, columns))
        except LlmattrError as err:  # a minimal pair whose continuations do not differ: name the file and the line
            raise LlmattrError(f"{path}: {at}: {err}") from None
    return task, examples
