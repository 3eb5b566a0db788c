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
from collections.abc import Mapping, Sequence
from pathlib import Path

from ..errors import LlmattrError
from ..readers import data_dir, data_path, list_cell, read_rows  # noqa: F401 - data_dir: its old home
from .base import SOURCE_KEYS, Task, gold_label, task_facts
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


def sample_data(task: Mapping, fix: str = "a JSONL/CSV file") -> str:
    """The name of ``task``'s sample data (:func:`task_facts`), refused in one line that says to pass ``fix``
    (a finetune's: ``--data FILE``) where it has none."""
    if not task["sample_data"]:
        raise LlmattrError(f"task {task['name']} has no sample data; pass {fix}")
    return task["sample_data"]


def selected_rows(rows: Sequence[Mapping], select: Mapping) -> list:
    """The ``rows`` whose columns hold every value of a task's ``select`` (BLiMP's paradigms share a file)."""
    return [row for row in rows if all(row.get(key) == value for key, value in select.items())]


def example_of_row(task: Mapping, row: Mapping, index: int, columns: Mapping | None = None) -> dict:
    """One raw row (the ``index``-th) as the id, fields and gold label of an example of ``task`` (:func:`task_facts`;
    its fields read from the columns ``columns`` maps them to, else the task's, else their own names: a name or a
    ``{column}`` format), refused in one line naming the row where a column is missing or the label is none the task
    reads (:func:`gold_label`)."""
    mapping = {**task["columns"], **(columns or {})}
    example = {"id": str(row.get("id", f"{task['name']}-{index}"))}
    for name in task["fields"]:
        column = mapping.get(name, name)
        try:
            example[name] = column.format(**row) if "{" in column else row[column]
        except KeyError as err:
            raise LlmattrError(f"task {task['name']}: row {example['id']} has no column {err.args[0]!r} for field "
                               f"{name!r}; map it with columns={{{name!r}: 'COLUMN'}}") from err
    label_column = mapping.get("label", task["label_field"])
    example["label"] = gold_label(task, row.get(label_column) if label_column else None, example["id"])
    return example


def check_shots(task: Mapping, shots: int, shots_from: str | Path | None) -> None:
    """Refuse ``shots`` demonstrations of ``task`` (:func:`task_facts`) drawn from its sample data where it has none,
    or from a ``shots_from`` file whose rows are no examples of it (:func:`example_of_row`; a task that composes or
    pairs its rows runs code on them first, so they are checked when drawn)."""
    if not shots:
        return
    if shots_from is None:
        sample_data(task)
    elif not (task["composed"] or task["paired"]):
        for i, row in enumerate(selected_rows(read_rows(shots_from, "--shots-from file"), task["select"])):
            example_of_row(task, row, i)


def per_class(n: int, k: int, i: int) -> int:
    """How many of a balanced sample of ``n`` the ``i``-th of ``k`` classes gives: ``n // k``, one more for the
    first ``n % k`` classes."""
    return n // k + (1 if i < n % k else 0)


def balanced_limit(sizes: list[int]) -> int:
    """The largest ``n`` :func:`check_balanced` lets through for classes of these sizes (in ``classes`` order): the
    remainder goes to the first classes, so 4 Positive + 1 Negative give 3 (2 + 1), not 2 x 1."""
    return max(n for n in range(sum(sizes) + 1)
               if all(per_class(n, len(sizes), i) <= size for i, size in enumerate(sizes)))


def check_balanced(sizes: Mapping[str, int], n: int) -> None:
    """Refuse a sample of ``n`` balanced over classes of these ``sizes`` (in ``classes`` order; class ``i`` gives
    :func:`per_class`) where a class has too few examples, naming the first such class and the largest ``n``
    (:func:`balanced_limit`)."""
    for i, (label, size) in enumerate(sizes.items()):
        if per_class(n, len(sizes), i) > size:
            raise LlmattrError(f"only {size} examples of class {label!r} for a balanced sample of {n}; ask for n <= "
                               f"{balanced_limit(list(sizes.values()))}, or for every row, unbalanced (--n all)")
