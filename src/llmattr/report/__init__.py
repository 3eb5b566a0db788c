"""``llmattr report``: paper-shaped tables, PNG figures and an HTML report from one or several stores.

Files written to the output folder (per model; a sub-folder per model when a store holds several):

- ``report.md``: every deterministic table in Markdown plus links to the figures (``--format md``);
- ``tables.tex`` (``latex``), ``<table>.csv`` (``csv``), ``report.html`` (``html``, self-contained);
- ``fig3_pi_curves_<dataset>_<routing>.png``, ``fig5_layers_<method>.png``, ``fig6_score_distribution.png``;
- ``table6_time.{md,tex,csv}``: attribution time per example. Wall times vary between runs, so Table 6
  lives in its own files and between timing markers in the HTML; everything else is byte-identical for
  identical stores (and for a resumed or sharded run of the same command).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

from ..checks import REPORT_FORMATS as FORMATS
from ..checks import check_resamples, parse_formats
from ..declarations import Catalog
from ..errors import LlmattrError
from ..stats import RESAMPLES
from ..store import Results
from . import figures, head, html, layouts, writers


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("_") or "model"


def write_model_report(results: Results, model: str, out: Path, formats: list[str],
                       resamples: int = RESAMPLES, *, catalog: Catalog) -> list[Path]:
    """Write one model's tables (``catalog.tables``), figures and HTML into ``out``; return the paths written."""
    out.mkdir(parents=True, exist_ok=True)
    all_tables = layouts.paper_tables(results, model, resamples, tables=catalog.tables, controls=catalog.controls)
    fixed = [t for t in all_tables if t.deterministic]
    timing = [t for t in all_tables if not t.deterministic]
    figs = (figures.all_figures(results, model, out, catalog, resamples)
            + head.pearson_figures(results, model, out, resamples, catalog.controls))
    written = [f.path for f in figs]
    if "md" in formats:
        lines = [f"# llmattr report: {model}", "", "Run settings:", "",
                 *(f"- {line}" for line in writers.settings_lines(results, model, resamples)), ""]
        lines += [writers.to_markdown(t) for t in fixed]
        lines += ["## Figures", "", *(f"![{f.path.stem}]({f.path.name})\n\n*{f.caption}*\n" for f in figs)]
        written.append(_write(out / "report.md", "\n".join(lines)))
        written += [_write(out / f"{t.name}.md", writers.to_markdown(t)) for t in timing]
    if "latex" in formats:
        written.append(_write(out / "tables.tex", "\n".join(writers.to_latex(t) for t in fixed)))
        written += [_write(out / f"{t.name}.tex", writers.to_latex(t)) for t in timing]
    if "csv" in formats:
        written += [_write(out / f"{t.name}.csv", writers.to_csv(t)) for t in all_tables]
    if "html" in formats:
        written.append(_write(out / "report.html", html.page(results, model, all_tables, figs, resamples)))
    return written


def _write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def build_report(stores: Iterable[str | Path], out: str | Path, formats: Iterable[str] = ("md", "html"),
                 resamples: int = RESAMPLES, *, catalog: Catalog) -> tuple[Results, list[Path]]:
    """Merge ``stores`` (files or globs) and write the report of every model into ``out``, with
    ``resamples`` bootstrap resamples per confidence interval. ``catalog`` (:func:`llmattr.api.catalog`:
    the registered metrics' tables and the methods' defaults) says what to render; the report itself
    imports no model, method or metric code."""
    check_resamples(resamples)
    results = Results(stores, catalog.method_defaults, catalog.datasets)
    models = results.models()
    if not models:
        names = ", ".join(map(str, results.paths))
        raise LlmattrError(f"no finished examples in {names}; run `llmattr evaluate` first")
    out = Path(out)
    written = []
    for model in models:
        folder = out if len(models) == 1 else out / _slug(model)
        written += write_model_report(results, model, folder, list(formats), resamples, catalog=catalog)
    return results, written


__all__ = ["FORMATS", "build_report", "parse_formats", "write_model_report"]
