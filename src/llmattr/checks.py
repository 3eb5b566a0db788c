"""Checks of user-given values that run before any heavy work (model load, attribution).

Each raises :class:`~llmattr.errors.LlmattrError` with one line that names the option and what to give,
so the CLI exits 2 in well under a second and nothing is computed, stored or written.
"""

from __future__ import annotations

import numbers
import os
import tempfile
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from .errors import LlmattrError, unknown_name

FIGURE_SUFFIXES = (".png", ".svg", ".pdf")  # what the figures are written as (matplotlib's Agg, SVG, PDF)
ROUTINGS = ("dynamic", "fixed")  # the perturbation metrics' routing protocols (paper 000 appendix K)
TARGET_MODES = ("label", "generated", "gold")  # what is explained: llmattr.targets
SCOPES = ("span", "prompt", "all")  # what is attributed: llmattr.targets
REPORT_FORMATS = ("md", "latex", "csv", "html")  # what llmattr report writes
DATA_TASK = "sentiment"  # the task that prompts the rows of a user's own file in llmattr evaluate --data
CHECKPOINTING = ("auto", "on", "off")  # activation checkpointing of the backward pass: llmattr.models.memory
DTYPES = ("float32", "fp32", "float16", "fp16", "bfloat16", "bf16")  # --dtype's names (and auto): models.loading


def positive_int(value: object, name: str) -> int:
    """``value`` as an int >= 1; floats, bools and strings are refused (``samples=2.5`` is a mistake)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise LlmattrError(f"{name} must be a whole number >= 1, got {value!r}")
    if value < 1:
        raise LlmattrError(f"{name} must be at least 1, got {value}")
    return int(value)


def mask_rate(value: object, name: str) -> float:
    """``value`` as a fraction in [0, 1) (F-Fidelity's beta, ``finetune --mask-augment``; 0: off)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0 <= value < 1:
        raise LlmattrError(f"{name} must be a fraction in [0, 1) (F-Fidelity's beta, e.g. 0.1), got {value!r}")
    return float(value)


def option_value(value: object, flag: str, default: object, positive: bool = False, valid: Iterable = ()) -> object:
    """``value`` of the option ``flag`` (a metric's declared option: its ``default``'s type, a whole number >= 1
    where ``positive``, one of ``valid`` where given), a text of a number default converted; else one line."""
    if isinstance(default, int | float) and not isinstance(default, bool) and isinstance(value, str):
        try:
            value = type(default)(value)
        except ValueError:
            raise LlmattrError(f"{flag} must be a number, got {value!r}") from None
    if positive:
        positive_int(value, flag)
    valid = tuple(valid)
    if valid and value not in valid:
        raise LlmattrError(f"{flag} must be one of {', '.join(map(str, valid))}; got {value!r}")
    return value


def one_of(value: object, valid: Iterable[str], name: str) -> str:
    """``value`` if it is one of ``valid``, else one line listing them."""
    valid = tuple(valid)
    if value not in valid:
        raise LlmattrError(unknown_name(name, value, valid))
    return value


def member(value: object, valid: Iterable[str], name: str) -> str:
    """``value`` if it is one of ``valid``, else one line ``NAME must be one of ...; got VALUE`` (the choices of
    what is explained and perturbed: target, scope, removal)."""
    valid = tuple(valid)
    if value not in valid:
        raise LlmattrError(f"{name} must be one of {', '.join(valid)}; got {value!r}")
    return value


def register_once(registry: dict, name: str, entry, kind: str):
    """``registry[name] = entry``, refusing a different entry under a name already taken (a silent overwrite
    would change what every user of that name gets); registering an equal entry again changes nothing."""
    if name in registry and registry[name] != entry:
        raise LlmattrError(f"{kind} {name!r} is already registered ({registry[name]!r:.80}); "
                           f"register the new one under another name")
    registry[name] = entry
    return entry


def writable_file(path: str | Path, option: str, suffixes: tuple[str, ...] | None = None) -> Path:
    """Refuse an output path that cannot be written, before the work whose result it would hold.

    The file may exist (then it must be a writable file) or not (then its folder must exist and be
    writable); nothing is left behind. The check opens the file for writing (or creates and removes a
    probe file beside it), so a read-only file system, ``/proc`` or ``/sys`` are refused even where
    ``os.access`` says yes (as root). ``suffixes`` limits the file types (figures: png, svg, pdf).
    """
    path = Path(path)
    if path.is_dir():
        raise LlmattrError(f"{option} {path} is a folder; give a file name")
    if suffixes is not None and path.suffix.lower() not in suffixes:
        raise LlmattrError(f"{option} {path}: give a file ending in {', '.join(suffixes)}")
    folder = path.parent if str(path.parent) else Path(".")
    if not folder.is_dir():
        raise LlmattrError(f"{option} {path}: folder {folder} does not exist")
    if path.exists() and not path.is_file():  # a device or a pipe (/dev/stdout): cannot be probed, only asked
        if not os.access(path, os.W_OK):
            raise LlmattrError(f"{option} {path} is not writable")
        return path
    try:
        if path.exists():
            with open(path, "ab"):  # appends nothing; /proc and /sys files refuse it (EINVAL, EACCES)
                pass
        else:  # a probe file of its own name, so processes checking the same path at once never collide
            with tempfile.NamedTemporaryFile(dir=folder, prefix=".llmattr-probe-"):
                pass
    except OSError as err:
        raise LlmattrError(f"{option} {path} cannot be written: {err.strerror or err}") from err
    return path


def check_checkpointing(value: object) -> None:
    """Refuse a ``checkpointing`` that is not one of :data:`CHECKPOINTING`."""
    if value not in CHECKPOINTING:
        raise LlmattrError(f"checkpointing must be one of {', '.join(CHECKPOINTING)}; got {value!r}")


def dtype_name(name: object) -> object:
    """``--dtype`` ``name`` if it is one of :data:`DTYPES`, ``auto`` or None (the default), else one line."""
    if name not in (None, "auto", *DTYPES):
        raise LlmattrError(f"unknown dtype {name!r}; use one of {', '.join(DTYPES)} or auto")
    return name


def examples_wanted(value: object) -> int | str | None:
    """``--n`` checked: a positive number (``"3"`` from the command line is 3), ``all`` or None (unset)."""
    if value is None or value == "all":
        return value
    if isinstance(value, str):
        if not value.strip().isdigit():
            raise LlmattrError(f"--n takes a number of examples or all (every row), got {value!r}")
        value = int(value)
    return positive_int(value, "--n")


def one_source(data: object, datasets: list[str] | None) -> None:
    """Refuse ``evaluate``'s ``--data`` (the user's file) beside ``--datasets`` (shipped ones)."""
    if data is not None and datasets is not None:
        raise LlmattrError(f"--data evaluates your file {data}; --datasets {','.join(datasets)} names shipped ones: "
                           "give one of them (run twice for both)")


def split_list(text: str) -> list[str]:
    """``"a,b, c"`` -> ``["a", "b", "c"]`` (empty items dropped)."""
    return [item.strip() for item in text.split(",") if item.strip()]


def parse_params(items: list[str], usage: str) -> dict:
    """Method parameters from ``key=value`` texts (``--param`` of ``explain``, ``name:key=value`` of
    ``evaluate``); integers and floats are converted, anything else stays text. ``usage`` ends the error
    line of an item without ``=``."""
    params: dict = {}
    for item in items:
        if "=" not in item:
            raise LlmattrError(f"method parameter {item!r} must be key=value ({usage})")
        key, value = (part.strip() for part in item.split("=", 1))
        for cast in (int, float):
            try:
                params[key] = cast(value)
                break
            except ValueError:
                continue
        else:
            params[key] = value
    return params


def split_spec(text: str) -> tuple[str, dict]:
    """An ``evaluate --methods`` item ``name[:key=value]...`` as the method's name and its parameters."""
    name, *items = text.split(":")
    return name.strip(), parse_params(items, f"in {text!r}, e.g. grad-ellm:layers=4")


def text_problem(text: object) -> str | None:
    """Why ``text`` cannot be explained (not a str or a dict of a task's fields, or empty), else None."""
    if not isinstance(text, str | dict):
        return (f"text must be a str (or a dict of the task's fields; a list explains each item), "
                f"got {type(text).__name__}")
    if isinstance(text, str) and not text.strip():
        return "empty text: give the text to explain"
    return None


def check_texts(texts: list, first: int = 0, noun: str = "item") -> None:
    """Refuse a batch in one line naming every text that cannot be explained (``noun`` and its number, counted
    from ``first``), before any work."""
    bad = {i + first: problem for i, item in enumerate(texts) if (problem := text_problem(item))}
    if bad:
        raise LlmattrError("cannot explain " + "; ".join(f"{noun} {i}: {why}" for i, why in bad.items()))


def check_text(text: object) -> None:
    """Refuse what is not a text (a str, or a dict of a multi-field task's fields) before any work."""
    problem = text_problem(text)
    if problem:
        raise LlmattrError(problem)


def parse_formats(text: str) -> list[str]:
    """``llmattr report --format``: ``md,html`` or ``all`` -> the list of formats; unknown ones list the valid
    ones."""
    if split_list(text) == ["all"]:
        return list(REPORT_FORMATS)
    return known_items(text, REPORT_FORMATS, lambda unknown: f"unknown report format "
                       f"{', '.join(unknown) or repr(text)}; valid: {', '.join(REPORT_FORMATS)}, all")


def known_items(text: object, valid: Sequence[str], refusal: Callable[[list[str]], str]) -> list[str]:
    """The comma-separated items of ``text``, each one of ``valid``; else the line ``refusal(unknown)`` (the
    unknown ones; none when there is no item at all)."""
    items = split_list(str(text))
    unknown = [item for item in items if item not in valid]
    if unknown or not items:
        raise LlmattrError(refusal(unknown))
    return items


def check_resamples(resamples: int) -> None:
    """Refuse fewer than one bootstrap resample per confidence interval (one line)."""
    if resamples < 1:
        raise LlmattrError("--bootstrap must be at least 1 resample (default 2000)")


def check_model_path(name_or_path: str) -> None:
    """Refuse, without loading anything, a folder without ``config.json`` or a path that does not exist (a name
    that reads as a hub id passes)."""
    path = Path(name_or_path).expanduser()
    if path.exists():
        if not (path / "config.json").is_file():
            raise LlmattrError(f"{name_or_path} is not a model folder (no config.json); pass a folder, a .gguf or a "
                               "hub id")
    elif name_or_path.startswith((".", "/", "~")) or name_or_path.count("/") > 1:
        raise LlmattrError(f"model path not found: {name_or_path}")
