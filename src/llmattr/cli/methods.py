"""``llmattr methods``: one line per registered attribution method."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from .app import app


def methods_table() -> Table:
    """A rich table: name, family, gradients?, signed?, cost in passes, summary."""
    from .. import methods

    table = Table(title="llmattr attribution methods")
    for column in ("name", "family", "gradients", "signed", "cost", "summary"):
        table.add_column(column, overflow="fold")
    for name in methods.available():
        cls = methods.REGISTRY[name]
        table.add_row(name, cls.family, "yes" if cls.needs_gradients else "no", "yes" if cls.signed else "no",
                      cls.cost, cls.summary)
    return table


@app.command("methods")
def list_methods() -> None:
    """List every attribution method: family, needs gradients?, signed?, cost in passes, summary."""
    Console().print(methods_table())
