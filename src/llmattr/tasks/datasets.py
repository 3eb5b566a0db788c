"""Dataset loaders: the sample files shipped in ``llmattr/data``, user JSONL/CSV files, Hugging Face ids.

Every loader returns plain dicts, one per example: ``id``, the task's fields (``text``, or
``passage``/``question``, ...), ``label`` (a label word, a float for regression, the target word for
BLiMP, or None) and task extras (a minimal pair's ``foil``, ``evidence_words`` and ``evidence``:
``Task.pairing``, ``Task.evidence``). Sampling is deterministic (``seed``) and balanced per class for
classification tasks, as paper 000 appendix C samples IMDb and SST2. Few-shot demonstrations come from the
examples that were not sampled.
"""

from __future__ import annotations

import random
from pathlib import Path

from ..errors import LlmattrError
from ..model_free import (
    balanced_limit,  # noqa: F401 - its old home
    check_balanced,
    example_of_row,
    per_class,
    sample_data,
    selected_rows,
    task_facts,
)
from ..readers import data_dir, data_path, list_cell, read_rows  # noqa: F401 - data_dir: its old home
from .base import SOURCE_KEYS, Task
from .catalog import get_task


def hf_rows(task: Task, hf_id: str | None = None, split: str | None = None) -> list[dict]:
    """Rows of a Hugging Face dataset (the task's recipe, or ``hf_id``), in the shared-data format."""
    spec = dict(task.hf) if hf_id is None else {"path": hf_id}
    if not spec:
        raise LlmattrError(f"task {task.name} has no Hugging Face recipe; pass a JSONL/CSV file")
    try:
        import datasets
    except ImportError as err:
        raise LlmattrError("reading Hugging Face datasets needs `pip install datasets`; "
                           "or pass a JSONL/CSV file") from err
    try:
        split = split or spec.get("split", "train")
        data = datasets.load_dataset(spec["path"], spec.get("name"), split=split)
    except Exception as err:  # offline, unknown id, gated dataset: one clear message
        first = (str(err).strip().splitlines() or [type(err).__name__])[0][:200]
        raise LlmattrError(
            f"cannot load {spec['path']} from the Hugging Face hub ({first}); offline? save the data as "
            "JSONL/CSV and pass the file"
        ) from err
    labels = spec.get("labels", {})
    label_key = spec.get("label", "label")
    rows = []
    for row in data:
        row = dict(row)
        for name, column in spec.get("columns", {}).items():
            row[name] = column.format(**row) if "{" in column else row[column]
        if label_key in row and task.label_field:
            row[task.label_field] = labels.get(row[label_key], row[label_key])
        rows.append(row)
    return rows


def resolve_rows(task: Task, source: str | Path | None = None,
                 split: str | None = None) -> tuple[list[dict], str]:
    """Raw rows and a source tag: ``None`` = the task's sample file, a path, a sample name, or ``hf[:id]``."""
    if source is None:
        source = sample_data(task_facts(task))
    text = str(source)
    if text == "hf" or text.startswith("hf:"):
        return hf_rows(task, text[3:] or None, split), text
    path = data_path(text)
    return read_rows(path), path.stem


def to_example(task: Task, row: dict, index: int, columns: dict | None = None) -> dict:
    """One raw row as a task example (fields renamed by ``columns``, label mapped, a minimal pair split:
    :meth:`Task.pair`)."""
    if task.pairing is not None:
        row = {**row, **task.pair(row)}
    example = example_of_row(task_facts(task), row, index, columns)
    for key in ("foil", "evidence_words", "evidence", *SOURCE_KEYS):
        if key in row:
            example[key] = list_cell(row[key])
    return example


def sample(examples: list[dict], n: int | None, seed: int = 0, balanced: bool = True,
           classes: tuple[str, ...] = ()) -> list[dict]:
    """``n`` examples drawn with ``random.Random(seed)``; with ``classes``, as equal per class as possible.

    Per class, the examples are shuffled and the first ones taken (``n // k`` each, the remainder to
    the first classes in ``classes`` order); the result is shuffled again. ``n=None`` keeps all.
    """
    rng = random.Random(seed)
    if n is None or not (balanced and classes):
        chosen = list(examples)
        rng.shuffle(chosen)
        return chosen[:n]
    groups = {label: [ex for ex in examples if ex["label"] == label] for label in classes}
    check_balanced({label: len(group) for label, group in groups.items()}, n)
    chosen = []
    for i, group in enumerate(groups.values()):
        rng.shuffle(group)
        chosen += group[:per_class(n, len(classes), i)]
    rng.shuffle(chosen)
    return chosen


def load_examples(task: str | Task, source: str | Path | None = None, n: int | None = None, seed: int = 0,
                  balanced: bool = True, columns: dict | None = None, split: str | None = None) -> list[dict]:
    """Examples of ``task`` from ``source`` (default: its sample file), ``n`` drawn with ``seed``.

    ``source``: None (the task's file in :func:`data_dir`), a JSONL/CSV/TSV path, a sample name
    (``sst2``), or ``hf``/``hf:<id>`` (Hugging Face ``datasets``; needs the hub). ``columns`` maps task
    fields (and ``label``) to the file's columns or ``{column}`` format strings.
    """
    task = get_task(task)
    rows, _ = resolve_rows(task, source, split)
    rows = selected_rows(rows, task.select)
    rows = task.compose(rows) if task.compose is not None else rows
    if not rows:
        raise LlmattrError(f"task {task.name}: no rows in {source or task.data} match {task.select}")
    examples = [to_example(task, row, i, columns) for i, row in enumerate(rows)]
    return sample(examples, n, seed, balanced, task.classes)


def draw_demonstrations(task: Task, pool: list[dict], k: int, seed: int = 0,
                        exclude: list[dict] = ()) -> list[dict]:
    """``k`` demonstrations from ``pool`` minus ``exclude`` (by id and by content), balanced per class."""
    if k < 0:
        raise LlmattrError("shots must be >= 0")
    if not k:
        return []
    ids = {ex["id"] for ex in exclude}
    contents = {task.user_content(ex)[0] for ex in exclude}
    rest = [ex for ex in pool if ex["id"] not in ids and task.user_content(ex)[0] not in contents
            and ex.get("label") is not None]
    if k > len(rest):
        raise LlmattrError(f"task {task.name}: only {len(rest)} examples left for {k} demonstrations")
    classes = task.classes if k >= len(task.classes) else ()
    return sample(rest, k, seed + 1, True, classes)


def render_demonstrations(task: Task, demos: list[dict]) -> str:
    """The few-shot text placed before the content span (``prepare(..., demonstrations=...)``)."""
    return "".join(task.demonstration(ex) for ex in demos)


def few_shot(task: str | Task, k: int, seed: int = 0, exclude: list[dict] = (), source=None,
             columns: dict | None = None) -> str:
    """Few-shot text of ``k`` demonstrations from ``source`` (default: the task's sample file)."""
    task = get_task(task)
    if not k:
        return ""
    return render_demonstrations(task, draw_demonstrations(task, load_examples(task, source, columns=columns),
                                                           k, seed, exclude))


def load_split(task: str | Task, n: int, shots: int = 0, seed: int = 0, source=None,
               columns: dict | None = None) -> tuple[list[dict], str]:
    """``n`` evaluated examples and the few-shot text of ``shots`` demonstrations drawn from the rest."""
    task = get_task(task)
    pool = load_examples(task, source, columns=columns)
    examples = sample(pool, n, seed, True, task.classes)
    return examples, render_demonstrations(task, draw_demonstrations(task, pool, shots, seed, examples))
