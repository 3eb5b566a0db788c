"""The typer application; each sub-command lives in its own module of this package.

A command whose options come from the registries (``explain``'s method parameters, ``evaluate``'s metric options)
is built with :func:`plugin_command`: its further options are derived from the registered plugins when the
command parses its arguments or prints its help, not when the application starts (so ``llmattr --help`` stays
light). A method, metric or task registered before that moment, by an installed package's ``llmattr.plugins``
entry point (loaded by :func:`load_plugins` before the CLI runs) or by a module imported in the same process,
has its options in the help and on the command line; no CLI module names it. The registries import no torch
(:mod:`llmattr.lazy`), so reading them keeps ``--help`` and the refusals free of it.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable
from importlib.metadata import entry_points

import typer
from typer.core import TyperCommand

from ..version import __version__

PLUGIN_GROUP = "llmattr.plugins"  # entry points: a module (or a callable) that registers methods, metrics, tasks
DERIVED = "llmattr.derived"  # ctx.meta key: the values of a plugin command's derived options, by name

app = typer.Typer(
    name="llmattr", add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
    help="Explain which input tokens an LLM relied on, and measure how faithful the explanation is.",
)


def load_plugins() -> list[str]:
    """Import every installed ``llmattr.plugins`` entry point (a module that registers its methods, metrics or
    tasks on import; a callable it names is called); return their names."""
    names = []
    for point in entry_points(group=PLUGIN_GROUP):
        loaded = point.load()
        if callable(loaded):
            loaded()
        names.append(point.name)
    return names


def typer_options(parameters: list[inspect.Parameter]) -> list:
    """The click options typer makes of ``parameters`` (each with a ``typer.Option`` default), built through
    typer's public API: a command of those parameters, whose options are taken."""
    def holder(**values):  # never called: only its signature is read
        return values

    holder.__signature__ = inspect.Signature(parameters)
    sub = typer.Typer(add_completion=False)
    sub.command()(holder)
    return typer.main.get_command(sub).params


def own(name: str, annotation: type, default: object, help: str, *decls: str, panel: str | None = None,
        hidden: bool = False) -> inspect.Parameter:
    """A command's own option (one that is no field of the library's request or config)."""
    return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, annotation=annotation,
                             default=typer.Option(default, *decls, help=help, rich_help_panel=panel, hidden=hidden))


def field_option(declared: dataclasses.Field, default: object = dataclasses.MISSING) -> inspect.Parameter:
    """The option of a field the library declares (:func:`llmattr.declarations.asked`: a
    :class:`~llmattr.request.Request`'s, an :class:`~llmattr.evaluation.EvalConfig`'s): its help, type and flags
    from the field, its default the field's unless ``default`` is given (``evaluate``'s are None: unset, so a
    ``--config`` file's value stands)."""
    meta = declared.metadata
    value = declared.default if default is dataclasses.MISSING else default
    return inspect.Parameter(declared.name, inspect.Parameter.KEYWORD_ONLY, annotation=meta["option"],
                             default=typer.Option(value, *meta["decls"], help=meta["help"]))


def command(parameters: list[inspect.Parameter]) -> Callable[[Callable], Callable]:
    """Decorator: the command function ``f(ctx, **given)`` with ``parameters`` as its options (in the help's
    order); typer reads them from its signature."""
    def give(fn: Callable) -> Callable:
        context = inspect.Parameter("ctx", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=typer.Context)
        fn.__signature__ = inspect.Signature([context, *parameters])
        return fn
    return give


class PluginCommand(TyperCommand):
    """A typer command with further options from ``derive()`` (a list of ``inspect.Parameter`` with
    ``typer.Option`` defaults), built from the registries at parse or help time; an option of the command's own
    name wins. Their values are in ``ctx.meta[DERIVED]`` (the command takes ``ctx: typer.Context``). ``helps()``
    gives the help of own options that list registered names (``{option name: help}``, e.g. ``--task``'s
    tasks), written at the same time."""

    derive: Callable[[], list[inspect.Parameter]] = staticmethod(list)
    helps: Callable[[], dict[str, str]] = staticmethod(dict)

    def derived(self, ctx) -> list:
        key = f"{DERIVED}.{self.name}"
        if key not in ctx.meta:
            helps = type(self).helps()
            for param in self.params:
                param.help = helps.get(param.name, param.help)
            taken = {p.name for p in self.params}
            ctx.meta[key] = [p for p in typer_options(type(self).derive()) if p.name not in taken]
        return ctx.meta[key]

    def get_params(self, ctx) -> list:
        params = super().get_params(ctx)
        own = len(self.params)
        return [*params[:own], *self.derived(ctx), *params[own:]]

    def invoke(self, ctx):
        ctx.meta[DERIVED] = {p.name: ctx.params.pop(p.name) for p in self.derived(ctx) if p.name in ctx.params}
        return super().invoke(ctx)


def plugin_command(derive: Callable[[], list[inspect.Parameter]] = list,
                   helps: Callable[[], dict[str, str]] = dict) -> type[PluginCommand]:
    """The :class:`PluginCommand` class for ``app.command(cls=...)`` whose options ``derive()`` adds and whose
    own options' help ``helps()`` writes."""
    return type("PluginCommand", (PluginCommand,), {"derive": staticmethod(derive), "helps": staticmethod(helps)})


def _version(value: bool) -> None:
    if value:
        typer.echo(f"llmattr {__version__}")
        raise typer.Exit()


@app.callback()
def _root(version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                       help="Print the llmattr version and exit.")) -> None:
    """Explain which input tokens an LLM relied on, and measure how faithful the explanation is."""
