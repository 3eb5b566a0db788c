"""Reading a user's file, free of torch: refused in one line naming the file, the line and the fix when it is
missing, a folder, empty, not UTF-8 or not JSON. The dataset loaders (:mod:`llmattr.tasks.datasets`) read through
these, and so do the CLI's model-free checks (``evaluate-scores``' scores file) before anything heavy loads."""

from __future__ import annotations

import csv
import io
import json
import os
from collections.abc import Mapping
from pathlib import Path

from .errors import LlmattrError, article

SUFFIXES = (".jsonl", ".json", ".csv", ".tsv")  # the data files read as rows


def check_file(path: Path, what: str = "data file") -> None:
    """Refuse, in one line, a ``path`` that is a folder or is missing."""
    if path.is_dir():
        raise LlmattrError(f"{path} is a folder; give the {what} itself")
    if not path.is_file():
        raise LlmattrError(f"{what} not found: {path}")


FILE_SHAPE = "give a file with a header (CSV/TSV) or one JSON object per row"  # what an empty data file lacks


def file_text(path: str | Path, what: str = "data file", shape: str = FILE_SHAPE) -> str:
    """The text of ``path``, refused in one line when it is missing, a folder, empty (``shape``: what to give
    instead) or not UTF-8 (the line and byte that are not)."""
    path = Path(path)
    check_file(path, what)
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        line = raw[:err.start].count(b"\n") + 1
        raise LlmattrError(f"{path}: line {line} is not UTF-8 (byte {raw[err.start]:#04x}); save the file as UTF-8 "
                           "(e.g. iconv -f latin1 -t utf-8)") from None
    if not text.strip():
        raise LlmattrError(f"{path} is empty; {shape}")
    return text


def json_error(path: Path, err: json.JSONDecodeError, offset: int = 0) -> LlmattrError:
    """One line naming the line of ``path`` that is not JSON (``offset``: lines before the parsed text)."""
    return LlmattrError(f"{path}: line {err.lineno + offset} is not JSON ({err.msg}, column {err.colno}); fix or "
                        "delete that line")


def read_json(path: str | Path, what: str = "data file") -> object:
    """The JSON value of ``path`` (:func:`file_text`'s refusals, and one line naming the line that is not JSON)."""
    path = Path(path)
    try:
        return json.loads(file_text(path, what))
    except json.JSONDecodeError as err:
        raise json_error(path, err) from None
    except RecursionError:
        raise LlmattrError(f"{path}: nested too deeply to be a {what}") from None


def read_jsonl(path: Path, what: str = "data file") -> tuple[list, list[int]]:
    """The JSON value of every non-blank line of ``path``, and its line number."""
    rows, lines = [], []
    for number, line in enumerate(file_text(path, what).split("\n"), 1):  # not splitlines: U+2028 is text
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as err:
                raise json_error(path, err, number - 1) from None
            except RecursionError:
                raise LlmattrError(f"{path}: line {number} is nested too deeply to be a row") from None
            lines.append(number)
    return rows, lines


def read_json_rows(path: Path, what: str = "data file") -> tuple[list, list[int]]:
    """The rows of a ``.json`` file: a list of objects, or one object (a single row); no line numbers are known,
    so each row's number is its place in the list (from 1)."""
    rows = read_json(path, what)
    rows = [rows] if isinstance(rows, dict) else rows
    if not isinstance(rows, list):
        raise LlmattrError(f"{path}: a .json data file holds a list of objects (one per row), not a "
                           f"{type(rows).__name__}")
    return rows, list(range(1, len(rows) + 1))


def read_table(path: Path, what: str = "data file") -> tuple[list, list[int]]:
    """The rows of a CSV or TSV file (its first line names the columns) and each row's line number; a row with
    more or fewer fields than the header is refused."""
    delimiter, name = ("\t", "tab") if path.suffix == ".tsv" else (",", "comma")
    reader = csv.reader(io.StringIO(file_text(path, what), newline=""), delimiter=delimiter)
    try:
        header = next(reader)
        if not any(column.strip() for column in header):
            raise LlmattrError(f"{path}: line 1 names no columns; the first line is the header (e.g. text,label)")
        rows, lines = [], []
        for cells in reader:
            if not any(cell.strip() for cell in cells):
                continue
            if len(cells) != len(header):
                raise LlmattrError(f"{path}: line {reader.line_num} has {len(cells)} field(s), the header "
                                   f"{len(header)}; quote a field that holds a {name} or fix the row")
            rows.append(dict(zip(header, cells, strict=True)))
            lines.append(reader.line_num)
    except csv.Error as err:
        raise LlmattrError(f"{path}: line {reader.line_num} is not {path.suffix[1:].upper()} ({err}); fix that "
                           "line") from None
    return rows, lines


READERS = {".jsonl": read_jsonl, ".json": read_json_rows, ".csv": read_table, ".tsv": read_table}


def data_dir() -> Path:
    """``$LLMATTR_DATA``, else the sample files shipped with the package (``llmattr/data``, SOURCES.md there)."""
    env = os.environ.get("LLMATTR_DATA")
    return Path(env) if env else Path(__file__).resolve().parent / "data"


def data_path(source: str) -> Path:
    """The file a data ``source`` names: a path (a JSONL/CSV/TSV name, or any file that exists), else the sample
    file of that name in :func:`data_dir` (``sst2`` -> ``sst2.jsonl``), refused in one line when there is none."""
    path = Path(source)
    if path.suffix not in SUFFIXES and not path.exists():
        path = data_dir() / f"{source}.jsonl"
        if not path.is_file():
            raise LlmattrError(
                f"no data file {source!r} (looked for {path}); pass a JSONL/CSV path, a sample name "
                f"({', '.join(sorted(p.stem for p in data_dir().glob('*.jsonl')))}) or hf:<dataset id>"
            )
    return path


def read_numbered_rows(path: str | Path, what: str = "data file") -> tuple[list[dict], list[int]]:
    """Rows of a JSONL (or JSON list), CSV or TSV file, as dicts of the file's columns, and each row's line
    number (a .json file: its place in the list). Every problem is one :class:`LlmattrError` line naming the
    file, the line and the fix: a missing file, a folder, an empty file, bytes that are not UTF-8, a line that is
    not JSON, a CSV row with the wrong number of fields, a row that is not an object, no rows at all."""
    path = Path(path)
    check_file(path, what)
    if path.suffix not in READERS:
        raise LlmattrError(f"{path}: unknown data format; use one of {', '.join(SUFFIXES)}")
    rows, lines = READERS[path.suffix](path, what)
    where = "line" if path.suffix != ".json" else "row"
    for row, line in zip(rows, lines, strict=True):
        if not isinstance(row, dict):
            raise LlmattrError(f"{path}: {where} {line} is {article(type(row).__name__)}, not an object of columns "
                               '(e.g. {"text": "...", "label": "..."})')
    if not rows:
        raise LlmattrError(f"{path}: no rows; add one row per example")
    return rows, lines


def read_rows(path: str | Path, what: str = "data file") -> list[dict]:
    """Rows of a JSONL (or JSON list), CSV or TSV file, as dicts of the file's columns
    (:func:`read_numbered_rows`' refusals)."""
    return read_numbered_rows(path, what)[0]


def list_cell(value):
    """A list-valued column as a list: JSON rows hold one; a CSV/TSV cell holds it as JSON text (``["a", "b"]``)."""
    if isinstance(value, str) and value.lstrip().startswith("["):
        try:
            return json.loads(value)
        except json.JSONDecodeError as err:
            raise LlmattrError(f"a list column is not JSON ({err.msg}): {value[:60]!r}") from None
    return value


def file_columns(shape: Mapping, text_field: str | None = None,
                 label_field: str | None | bool = None) -> tuple[dict, dict]:
    """The map from a task's fields (and ``"label"`` unless ``label_field`` is ``False``) to a file's columns,
    and the fix to name when a row lacks one. ``shape``: the task's ``name``, ``fields``, ``columns`` (field ->
    column), ``label_field`` (among :func:`llmattr.tasks.base.task_facts`)."""
    fields = shape["fields"]
    columns = {name: shape["columns"].get(name, name) for name in fields}
    if text_field:
        columns[fields[0]] = text_field
    hints = {fields[0]: "set --text-field", "label": "set --label-field",
             **{name: f"task {shape['name']} reads it by this name" for name in fields[1:]}}
    if label_field is not False:
        columns["label"] = label_field or shape["label_field"] or "label"
    return columns, hints


def shaped_rows(shape: Mapping, path: str | Path, text_field: str | None = None,
                label_field: str | None | bool = None) -> tuple[list[dict], list[str], dict]:
    """Every row of ``path`` (:func:`read_numbered_rows`), where each is (``line N``; a .json file's ``row N``)
    and the map from the task's fields (and ``"label"`` when ``label_field`` is not ``False``) to the file's
    columns (:func:`file_columns`), each row checked to hold them all (one line naming the file's columns)."""
    path = Path(path)
    rows, lines = read_numbered_rows(path)
    where = [f"{'row' if path.suffix == '.json' else 'line'} {line}" for line in lines]
    columns, hints = file_columns(shape, text_field, label_field)
    for row, at in zip(rows, where, strict=True):
        for name, column in columns.items():
            if column not in row:
                what = "the label" if name == "label" else f"field {name!r}"
                raise LlmattrError(f"{path}: {at} has no column {column!r} for {what} ({hints[name]}); "
                                   f"its columns: {', '.join(map(str, row))}")
            if row[column] is None:  # JSON null: no value, not the text "None"
                raise LlmattrError(f"{path}: {at} has no value (null) in column {column!r}")
    return rows, where, columns


def row_texts(shape: Mapping, path: str | Path, text_field: str | None = None,
              documents_field: str | None = None) -> list[str | dict]:
    """The text of every row of ``path`` as :func:`llmattr.explain` takes it (the first field's string, or a dict
    of every field for a multi-field task or a task that takes documents, whose list is the column
    ``documents_field``, default ``documents``: a JSON list, or in a CSV/TSV cell a JSON list as text), in file
    order; no label is read (``llmattr explain --data``)."""
    rows, where, columns = shaped_rows(shape, path, text_field, label_field=False)
    texts = [{name: str(row[column]) for name, column in columns.items()} for row in rows]
    if shape["documents"]:
        column = documents_field or "documents"
        for text, row, at in zip(texts, rows, where, strict=True):
            if column not in row:
                raise LlmattrError(f"{path}: {at} has no column {column!r} for the documents (set "
                                   f"--documents-field); its columns: {', '.join(map(str, row))}")
            text["documents"] = list_cell(row[column])
    return shaped_texts(shape, texts)


def shaped_texts(shape: Mapping, examples: list[dict]) -> list[str | dict]:
    """Each example's text as :func:`llmattr.explain` takes it: its first field, or a dict of every field of a
    multi-field task (and its ``documents`` for a task that takes them)."""
    fields = tuple(shape["fields"])
    if len(fields) == 1 and not shape["documents"]:
        return [example[fields[0]] for example in examples]
    keep = fields + (("documents",) if shape["documents"] else ())
    return [{name: example[name] for name in keep} for example in examples]


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
