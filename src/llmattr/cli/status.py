"""``llmattr status``: done / total per shard and per (dataset, method), failures and an ETA, while the shards run."""

from __future__ import annotations

import json

import typer
from rich.console import Console
from rich.table import Table

from .app import app


def duration(seconds: float | None) -> str:
    """``1h02m``, ``3m05s`` or ``12s``; ``?`` when unknown."""
    if seconds is None:
        return "?"
    minutes, secs = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


def fraction(done: int, total: int | None) -> str:
    """``done/total``, ``done/?`` when the store records no plan."""
    return f"{done}/{'?' if total is None else total}"


def status_table(statuses: list) -> Table:
    """A rich table: a row per store and (model, dataset, method), then the run's total row."""
    table = Table(title="llmattr status")
    for column in ("store", "model", "dataset", "method", "done", "failed", "ETA"):
        table.add_column(column, overflow="fold", justify="right" if column in ("done", "failed", "ETA") else "left")
    for shard in statuses:
        for line in shard.lines:
            siblings = [other.params for other in shard.lines if other.method == line.method]
            table.add_row(shard.path.name, line.model, line.dataset, line.label(siblings),
                          fraction(line.done, line.total), str(line.failed), duration(line.eta_s))
        table.add_row(shard.path.name, "", "", "all", fraction(shard.done, shard.total), str(len(shard.failures)),
                      duration(shard.eta_s), style="bold", end_section=True)
    return table


@app.command()
def status(
    stores: list[str] = typer.Argument(..., help="Store files or globs (e.g. 'results.rank*.sqlite'), read while "
                                                 "the shards write them."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of the table."),
) -> None:
    """Print done / total per shard and per (dataset, method), the failures and an ETA from the stores' timings."""
    from ..status import as_json as status_json
    from ..status import read_statuses

    statuses = read_statuses(stores)
    if as_json:
        typer.echo(json.dumps(status_json(statuses), indent=2))
        return
    console = Console()
    console.print(status_table(statuses))
    summary = status_json(statuses)
    console.print(f"{len(statuses)} store(s): {fraction(summary['done'], summary['total'])} units done, "
                  f"{sum(len(s.failures) for s in statuses)} failed, ETA {duration(summary['eta_s'])} "
                  "(the slowest shard)", highlight=False)
    for shard in statuses:
        for failure in shard.failures:
            console.print(f"failed in {shard.path.name}: {failure}", markup=False, highlight=False, soft_wrap=True)
