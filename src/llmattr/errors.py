"""The one exception type users can cause, warnings recorded on results, and the refusals of names that need no
registry loaded (so the CLI can give them without importing torch)."""

from collections.abc import Iterable, Mapping


class LlmattrError(ValueError):
    """A mistake the user can fix (bad path, empty text, unknown method, pi outside (0,1), ...).

    The message is one line that says what to do; the CLI prints it and exits with status 2.
    """


class NotExplainedWarning(UserWarning):
    """Some items of a batch were not explained (the others were kept): ``llmattr.explain`` names them, and the CLI,
    whose own error line names them too, filters this category out."""


def method_refusal(name: str, available: Iterable[str], not_defined: Mapping[str, str]) -> str | None:
    """The line refusing the method ``name`` given the registered names and the methods not defined for
    decoder-only models (name: why), or None when ``name`` is registered."""
    if name in not_defined:
        return f"{name} is not defined for decoder-only models: {not_defined[name]}"
    return None if name in available else unknown_name("method", name, sorted(available))


def unknown_name(kind: str, name: object, valid: Iterable[str]) -> str:
    """The line refusing ``name``, which is no ``kind`` of ``valid`` (listed in the given order)."""
    return f"unknown {kind} {name!r}; valid: {', '.join(valid)}"


def metric_refusal(names: Iterable[str], valid: Iterable[str]) -> str | None:
    """The line refusing metric ``names`` given the registered metric and output names ``valid``: the unknown
    ones, or none given; None when every name is known."""
    valid, names = list(valid), list(names)
    unknown = [name for name in names if name not in valid]
    if not unknown and names:
        return None
    what = f"unknown metric {', '.join(map(repr, unknown))}" if unknown else "no metric given"
    return f"{what}; valid: {', '.join(sorted(valid))}"


def article(word: str) -> str:
    """``word`` with its indefinite article, as a refusal line says it ("an int", "a list", "an open task")."""
    return f"{'an' if word[:1].lower() in 'aeiou' else 'a'} {word}"
