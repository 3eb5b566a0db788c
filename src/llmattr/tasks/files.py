"""A user's own data file (JSONL, JSON list, CSV, TSV) as examples of a task.

``--data my.csv --text-field review --label-field label [--labels 0=Negative,1=Positive]``: the column
``review`` fills the task's first field (its other fields keep their names), ``label`` holds the gold label,
mapped to the task's label words by the task's own map (``positive`` -> ``Positive``) or by ``--labels``.
Every row is checked before anything heavy runs: a missing column is one line naming the columns the file has.
One reader serves ``llmattr finetune --data``, ``llmattr evaluate --data`` and ``llmattr explain --data``
(the texts alone: :func:`read_file_texts`).
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from ..errors import LlmattrError
from .base import Task
from .catalog import get_task
from .datasets import list_cell, read_numbered_rows, to_example


def parse_labels(text: str) -> tuple[tuple[str, ...], dict]:
    """``--labels``: ``Positive,Negative`` (the file holds the words) or ``0=Negative,1=Positive`` (file value =
    label word), as (label words in the given order, map from file value to word)."""
    items = [item.strip() for item in text.split(",") if item.strip()]
    pairs = [item.split("=", 1) if "=" in item else (item, item) for item in items]
    words = tuple(dict.fromkeys(word.strip() for _, word in pairs))
    if len(words) < 2 or any(not word for word in words):
        raise LlmattrError(f"--labels needs at least two label words, e.g. Positive,Negative or "
                           f"0=Negative,1=Positive; got {text!r}")
    return words, {value.strip(): word.strip() for value, word in pairs}


def file_task(task: str | Task, labels: str | None = None) -> Task:
    """``task`` with the label words of ``--labels`` (a classification task only)."""
    task = get_task(task)
    if labels is None:
        return task
    if not task.classifies:
        raise LlmattrError(f"--labels applies to classification tasks; {task.name} is a {task.kind} task")
    words, mapping = parse_labels(labels)
    return replace(task, label_words=words, label_map=mapping)


def label_text(value) -> str | None:
    """A label cell as text: CSV cells are text already; JSON ``1`` -> ``"1"``, ``true`` -> ``"true"``."""
    return value if value is None or isinstance(value, str) else json.dumps(value)


def file_rows(task: Task, path: str | Path, text_field: str | None = None,
              label_field: str | None = None) -> tuple[list[dict], list[str], dict]:
    """Every row of ``path``, where each is (``line N``; a .json file's ``row N``) and the map from the task's
    fields (and ``"label"`` when ``label_field`` is not ``False``) to the file's columns, each row checked to hold
    them all (one line naming the file's columns)."""
    path = Path(path)
    rows, lines = read_numbered_rows(path)
    where = [f"{'row' if path.suffix == '.json' else 'line'} {line}" for line in lines]
    columns = {name: task.columns.get(name, name) for name in task.fields}
    if text_field:
        columns[task.fields[0]] = text_field
    hints = {task.fields[0]: "set --text-field", "label": "set --label-field",
             **{name: f"task {task.name} reads it by this name" for name in task.fields[1:]}}
    if label_field is not False:
        columns["label"] = label_field or task.label_field or "label"
    for row, at in zip(rows, where, strict=True):
        for name, column in columns.items():
            if column not in row:
                what = "the label" if name == "label" else f"field {name!r}"
                raise LlmattrError(f"{path}: {at} has no column {column!r} for {what} ({hints[name]}); "
                                   f"its columns: {', '.join(map(str, row))}")
            if row[column] is None:  # JSON null: no value, not the text "None"
                raise LlmattrError(f"{path}: {at} has no value (null) in column {column!r}")
    return rows, where, columns


def read_file_texts(task: str | Task, path: str | Path, text_field: str | None = None,
                    documents_field: str | None = None) -> list[str | dict]:
    """The text of every row of ``path`` as :func:`llmattr.explain` takes it (the first field's string, or a dict
    of every field for a multi-field task or a task that takes documents, whose list is the column
    ``documents_field``, default ``documents``: a JSON list, or in a CSV/TSV cell a JSON list as text), in file
    order; no label is read (``llmattr explain --data``)."""
    task = get_task(task)
    rows, where, columns = file_rows(task, path, text_field, label_field=False)
    texts = [{name: str(row[column]) for name, column in columns.items()} for row in rows]
    if task.documents:
        column = documents_field or "documents"
        for text, row, at in zip(texts, rows, where, strict=True):
            if column not in row:
                raise LlmattrError(f"{path}: {at} has no column {column!r} for the documents (set "
                                   f"--documents-field); its columns: {', '.join(map(str, row))}")
            text["documents"] = list_cell(row[column])
    return example_texts(task, texts)


def example_texts(task: Task, examples: list[dict]) -> list[str | dict]:
    """Each example's text as :func:`llmattr.explain` takes it: its first field, or a dict of every field of a
    multi-field task (and its ``documents`` for a task that takes them)."""
    if len(task.fields) == 1 and not task.documents:
        return [example[task.fields[0]] for example in examples]
    keep = task.fields + (("documents",) if task.documents else ())
    return [{name: example[name] for name in keep} for example in examples]


def read_file_examples(task: str | Task, path: str | Path, text_field: str | None = None,
                       label_field: str | None = None, labels: str | None = None) -> tuple[Task, list[dict]]:
    """The task (with ``--labels`` applied) and every row of ``path`` as one of its examples, in file order.

    Raises :class:`LlmattrError` (one line) for a missing file, an empty file, a row without the text or label
    column, or a label that is none of the label words.
    """
    task = file_task(task, labels)
    path = Path(path)
    rows, where, columns = file_rows(task, path, text_field, label_field)
    label_column = columns["label"]
    rows = [{"id": f"{path.stem}-{i}", **row} for i, row in enumerate(rows)]
    rows = [{**row, label_column: label_text(row[label_column])} for row in rows]
    examples = []
    for i, (row, at) in enumerate(zip(rows, where, strict=True)):
        try:
            examples.append(to_example(task, row, i, columns))
        except LlmattrError as err:  # a label that is no label word: name the file and the line
            raise LlmattrError(f"{path}: {at}: {err}") from None
    return task, examples
