"""A user's own data file (JSONL, JSON list, CSV, TSV) as examples of a task.

``--data my.csv --text-field review --label-field label [--labels 0=Negative,1=Positive]``: the column
``review`` fills the task's first field (its other fields keep their names), ``label`` holds the gold label,
mapped to the task's label words by the task's own map (``positive`` -> ``Positive``) or by ``--labels``.
Every row is checked before anything heavy runs: a missing column is one line naming the columns the file has.
One reader serves ``llmattr finetune --data``, ``llmattr evaluate --data`` and ``llmattr explain --data``
(the texts alone: :func:`read_file_texts`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path

from ..errors import LlmattrError, article
from ..readers import parse_labels, row_texts, shaped_rows, shaped_texts  # noqa: F401 - parse_labels: its old home
from .base import Task, gold_label, label_text, task_facts
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
    with the task's facts: :func:`llmattr.tasks.base.task_facts`)."""
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


def file_labels(task: Mapping, labels: str) -> tuple[tuple[str, ...], dict]:
    """``--labels`` of a file's rows for ``task`` (:func:`task_facts`; a classification task only) as
    :func:`llmattr.readers.parse_labels` reads them."""
    if not task["classifies"]:
        raise LlmattrError(f"--labels applies to classification tasks; {task['name']} is {article(task['kind'])} task")
    return parse_labels(labels)


def file_rows(task: Mapping, path: Path, rows: Sequence[Mapping], where: Sequence[str],
              label_column: str) -> tuple[list[dict], list]:
    """The ``rows`` of a user's file ``path`` (:func:`llmattr.readers.shaped_rows`, each at ``where``) as ``task``
    (:func:`task_facts`) reads them: each with its id (its own ``id`` column, else ``{file stem}-{i}``) and its
    label cell as text (:func:`label_text`); and each row's gold label (:func:`gold_label`; None for every row of a
    task whose rows hold minimal pairs: the label comes from the pair, read there), refused naming the file and the
    line."""
    rows = [{"id": f"{path.stem}-{i}", **row, label_column: label_text(row[label_column])}
            for i, row in enumerate(rows)]
    gold = [None] * len(rows)
    if not task["paired"]:
        for i, (row, at) in enumerate(zip(rows, where, strict=True)):
            try:
                gold[i] = gold_label(task, row[label_column], str(row["id"]))
            except LlmattrError as err:
                raise LlmattrError(f"{path}: {at}: {err}") from None
    return rows, gold
