"""``llmattr methods``: one line per registered attribution method."""

from __future__ import annotations

import json

import typer
from rich.console import Console, Group
from rich.padding import Padding
from rich.table import Table
from rich.text import Text

from .app import app


def methods_table() -> Table:
    """A rich table: name, family, gradients?, signed?, default objective (``-``: none), cost in passes, summary."""
    from .. import methods

    table = Table(title="llmattr attribution methods")
    for column in ("name", "family", "gradients", "signed", "objective", "cost", "summary"):
        table.add_column(column, overflow="fold")
    for name in methods.available():
        cls = methods.REGISTRY[name]
        table.add_row(name, cls.family, "yes" if cls.needs_gradients else "no", "yes" if cls.signed else "no",
                      cls.objective or "-", cls.cost, cls.summary)
    return table


WIDE = 140  # below this many columns the table's seven columns break words; the list form is used instead


def methods_list() -> Group:
    """The same facts for a narrow terminal: a line per method (name, family, gradients, signed, objective),
    then its summary and cost wrapped at whole words under it."""
    from .. import methods

    entries = []
    for name in methods.available():
        cls = methods.REGISTRY[name]
        facts = (cls.family, "gradients" if cls.needs_gradients else "no gradients",
                 "signed" if cls.signed else "unsigned", f"objective {cls.objective or '-'}")
        entries += [Text.assemble((name, "bold"), "  " + " \u00b7 ".join(facts)),
                    Padding(Text(cls.summary), (0, 0, 0, 4)), Padding(Text(f"cost: {cls.cost}", style="dim"),
                                                                      (0, 0, 0, 4))]
    return Group(Text("llmattr attribution methods", style="bold"), *entries)


def methods_records() -> list[dict]:
    """One dict per method: name, family, gradients, signed, cost, summary, default parameters and the
    objective it explains by default (``None``: it scores no model output and refuses ``--objective``)."""
    from .. import methods

    return [{"name": name, "family": cls.family, "gradients": cls.needs_gradients, "signed": cls.signed,
             "cost": cls.cost, "summary": cls.summary, "defaults": dict(cls.defaults), "objective": cls.objective}
            for name, cls in ((name, methods.REGISTRY[name]) for name in methods.available())]


@app.command("methods")
def list_methods(as_json: bool = typer.Option(False, "--json", help="Print a JSON list instead of the table.")) -> None:
    """List every attribution method: family, needs gradients?, signed?, default objective, cost, summary."""
    if as_json:
        typer.echo(json.dumps(methods_records(), indent=1))
    else:
        console = Console()
        console.print(methods_table() if console.width >= WIDE else methods_list())
