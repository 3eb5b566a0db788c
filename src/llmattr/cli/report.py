"""``llmattr report``: tables (md/LaTeX/CSV), PNG figures and an HTML report from one or more stores."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console
from rich.markdown import Markdown

from ..checks import check_resamples, parse_formats
from ..store import expand
from .app import app


@app.command()
def report(
    stores: list[str] = typer.Argument(..., help="Store files or globs (e.g. 'results.rank*.sqlite'); "
                                                 "shards of one run are merged."),
    format: str = typer.Option("md,csv,html", "--format", help="Comma-separated: md, latex, csv, html, "
                                                                       "or all."),
    out: Path = typer.Option(None, help="Output folder (default: report/ beside the first store)."),
    bootstrap: int = typer.Option(2000, "--bootstrap", help="Bootstrap resamples per 95% confidence interval "
                                                             "(seeded)."),
) -> None:
    """Write the paper-shaped tables, figures and HTML report; print the task accuracy and Table 1 (without
    pi-Soft: the run's first table)."""
    check_resamples(bootstrap)  # the options, then a missing store, refused before the registries (and torch) load
    formats = parse_formats(format)
    expand(stores)
    from ..api import catalog
    from ..report import build_report
    from ..report.layouts import paper_tables
    from ..report.writers import to_markdown

    known = catalog()
    results, written = build_report(stores, out if out is not None else Path(stores[0]).parent / "report",
                                    formats, bootstrap, catalog=known)
    console = Console()
    for model in results.models():
        tables = paper_tables(results, model, bootstrap, tables=known.tables, controls=known.controls)
        for table in headline(tables):
            console.print(Markdown(to_markdown(table)))
    folders = sorted({str(p.parent) for p in written})
    console.print(f"wrote {len(written)} files to {', '.join(folders)}", highlight=False)


def headline(tables: list) -> list:
    """The tables printed on the terminal: the task accuracy and Table 1, or the run's first table where it has
    no pi-Soft values (each rendered by rich at the terminal's width; the files hold them all)."""
    accuracy = [table for table in tables if table.name == "table_accuracy"]
    others = [table for table in tables if table.name != "table_accuracy"]
    return accuracy + ([table for table in others if table.name == "table1_pi_soft_auc"] or others[:1])
