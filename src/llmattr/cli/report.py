"""``llmattr report``: tables (md/LaTeX/CSV), PNG figures and an HTML report from one or more stores."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console

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
    """Write the paper-shaped tables, figures and HTML report; print Table 1."""
    from ..report import build_report, parse_formats
    from ..report.tables import paper_tables, to_markdown

    formats = parse_formats(format)
    results, written = build_report(stores, out if out is not None else Path(stores[0]).parent / "report",
                                    formats, bootstrap)
    console = Console()
    for model in results.models():
        table1 = [t for t in paper_tables(results, model, bootstrap) if t.name == "table1_pi_soft_auc"]
        if table1:
            console.print(to_markdown(table1[0]), markup=False, highlight=False, soft_wrap=True)
    folders = sorted({str(p.parent) for p in written})
    console.print(f"wrote {len(written)} files to {', '.join(folders)}", highlight=False)
