"""Reading a user's file, free of torch: refused in one line naming the file, the line and the fix when it is
missing, a folder, empty, not UTF-8 or not JSON. The dataset loaders (:mod:`llmattr.tasks.datasets`) read through
these, and so do the CLI's model-free checks (``evaluate-scores``' scores file) before anything heavy loads."""

from __future__ import annotations

import json
from pathlib import Path

from .errors import LlmattrError


def check_file(path: Path, what: str = "data file") -> None:
    """Refuse, in one line, a ``path`` that is a folder or is missing."""
    if path.is_dir():
        raise LlmattrError(f"{path} is a folder; give the {what} itself")
    if not path.is_file():
        raise LlmattrError(f"{what} not found: {path}")


def file_text(path: str | Path, what: str = "data file") -> str:
    """The text of ``path``, refused in one line when it is missing, a folder, empty or not UTF-8 (the line and
    byte that are not)."""
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
        raise LlmattrError(f"{path} is empty; give a file with a header (CSV/TSV) or one JSON object per row")
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
