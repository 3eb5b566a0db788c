"""The paper-shaped tables of ``llmattr report``, built from merged stores and rendered as md/LaTeX/CSV/HTML.

Every number is a mean over examples of a per-example value (a per-example value is itself the mean
over its generation steps and, for curve metrics summarised by one number, over the curve's points),
summed with :func:`math.fsum` so the result does not depend on the order rows were written in (shards,
resumed runs). Formatting is fixed per table; ranks are taken on the unrounded means, ties broken by
method label. Output is therefore byte-identical for identical stores, except the timing table
(:func:`timing_table`, Table 6 of paper 000), which is marked ``deterministic=False``.
"""

from __future__ import annotations

import csv
import html
import io
import json
import math
from collections import defaultdict
from dataclasses import dataclass

from ..runner import method_label
from ..store import NONE, Results

DATASET_ORDER = ("imdb", "sst2", "boolq", "tellmewhy", "wikibio")
DISPLAY = {"imdb": "IMDb", "sst2": "SST2", "boolq": "BoolQ", "tellmewhy": "TellMeWhy", "wikibio": "WikiBio",
           "qnli": "QNLI", "stsb": "STS-B", "blimp": "BLiMP"}
MARKS = {1: "¹", 2: "²", 3: "³"}


def dataset_name(name: str) -> str:
    return DISPLAY.get(name, name)


def dataset_key(name: str) -> tuple[int, str]:
    return (DATASET_ORDER.index(name) if name in DATASET_ORDER else len(DATASET_ORDER), name)


def mean(values: list[float]) -> float:
    return math.fsum(values) / len(values)


# ---------------------------------------------------------------------------------------- aggregation
def per_example(results: Results, model: str, metric: str, routing: str) -> dict[tuple, dict[str, dict]]:
    """``{(dataset, label): {example: {pi: value}}}``, each value the mean over generation steps."""
    acc: dict = defaultdict(lambda: defaultdict(lambda: defaultdict(list)))
    for dataset, method, params, example, pi, _step, value in results.values(model, metric, routing):
        acc[(dataset, method_label(method, params))][example][pi].append(value)
    return {key: {ex: {pi: mean(v) for pi, v in points.items()} for ex, points in examples.items()}
            for key, examples in acc.items()}


def scalar_means(results: Results, model: str, metric: str, routing: str) -> dict[tuple, float]:
    """``{(dataset, label): mean over examples}`` of each example's value (mean over its curve points)."""
    return {key: mean([mean(list(points.values())) for points in examples.values()])
            for key, examples in per_example(results, model, metric, routing).items()}


def curve_means(results: Results, model: str, metric: str, routing: str) -> dict[tuple, dict[float, float]]:
    """``{(dataset, label): {pi: mean over examples}}`` for curve metrics (rows with pi != -1)."""
    out = {}
    for key, examples in per_example(results, model, metric, routing).items():
        by_pi: dict = defaultdict(list)
        for points in examples.values():
            for pi, value in points.items():
                if pi != NONE:
                    by_pi[pi].append(value)
        if by_pi:
            out[key] = {pi: mean(v) for pi, v in sorted(by_pi.items())}
    return out


# ---------------------------------------------------------------------------------------- table model
@dataclass
class Cell:
    value: float | None
    text: str
    rank: int | None = None


@dataclass
class Section:
    title: str
    rows: list[tuple[str, list[Cell]]]


@dataclass
class Table:
    """A titled grid with sections (e.g. one per metric); ``rank`` 1-3 marks best/2nd/3rd."""

    name: str
    title: str
    caption: str
    corner: str
    columns: list[str]
    sections: list[Section]
    deterministic: bool = True

    @property
    def ranked(self) -> bool:
        return any(c.rank for s in self.sections for _, cells in s.rows for c in cells)


def _cells(values: list[float | None], fmt: str, higher: bool | None) -> list[Cell]:
    """Format values; ranks 1-3 by unrounded value (``higher`` says which way is better; None = no ranks)."""
    cells = [Cell(v, "–" if v is None else format(v, fmt)) for v in values]
    if higher is not None:
        order = sorted((i for i, v in enumerate(values) if v is not None),
                       key=lambda i: (-values[i] if higher else values[i], i))
        for rank, i in enumerate(order[:3], start=1):
            cells[i].rank = rank
    return cells


@dataclass(frozen=True)
class MetricRow:
    """One metric of a table: stored name, display name, direction and number format."""

    metric: str
    title: str
    higher: bool
    fmt: str = ".3f"


def metric_grid(results: Results, model: str, metrics: list[MetricRow],
                routing: str) -> tuple[dict, list[str], list[str]] | None:
    """Mean of each metric per (dataset, method label), with the sorted datasets and labels; None if empty."""
    data = {m.metric: scalar_means(results, model, m.metric, routing) for m in metrics}
    keys = {key for values in data.values() for key in values}
    if not keys:
        return None
    return data, sorted({d for d, _ in keys}, key=dataset_key), sorted({label for _, label in keys})


def datasets_by_methods(results: Results, model: str, name: str, title: str, caption: str,
                        metrics: list[MetricRow], routing: str, mark_all_rows: bool) -> Table | None:
    """Paper 000 Tables 1/4/8: one section per metric, rows = datasets + Avg, columns = methods.

    ``mark_all_rows``: best/2nd/3rd on every row (Table 4), else on the Avg row only (Tables 1, 8).
    """
    grid = metric_grid(results, model, metrics, routing)
    if grid is None:
        return None
    data, datasets, labels = grid
    sections = []
    for m in metrics:
        values = data[m.metric]
        rows = []
        for d in datasets:
            row = [values.get((d, label)) for label in labels]
            rows.append((dataset_name(d), _cells(row, m.fmt, m.higher if mark_all_rows else None)))
        avg = [mean(col) if None not in (col := [values.get((d, label)) for d in datasets]) else None
               for label in labels]
        rows.append(("Avg", _cells(avg, m.fmt, m.higher)))
        sections.append(Section(f"{m.title} {'↑' if m.higher else '↓'}", rows))
    return Table(name, title, caption, "Dataset", labels, sections)


def methods_by_datasets(results: Results, model: str, name: str, title: str, caption: str,
                        metrics: list[MetricRow], routing: str) -> Table | None:
    """Paper 003 Tables 1, 4-6: rows = methods, columns = datasets, a section per metric, best per column."""
    grid = metric_grid(results, model, metrics, routing)
    if grid is None:
        return None
    data, datasets, labels = grid
    sections = []
    for m in metrics:
        columns = [_cells([data[m.metric].get((d, label)) for label in labels], m.fmt, m.higher)
                   for d in datasets]
        rows = [(label, [col[i] for col in columns]) for i, label in enumerate(labels)]
        sections.append(Section(f"{m.title} {'↑' if m.higher else '↓'}", rows))
    return Table(name, title, caption, "Method", [dataset_name(d) for d in datasets], sections)


def metrics_by_methods(results: Results, model: str, name: str, title: str, caption: str,
                       metrics: list[MetricRow], routing: str) -> Table | None:
    """Paper 000 Table 2: a section per dataset, rows = Soft-NS, Soft-NC, E[R], columns = methods."""
    grid = metric_grid(results, model, metrics, routing)
    if grid is None:
        return None
    data, datasets, labels = grid
    sections = [Section(dataset_name(d), [
        (f"{m.title}{' ↑' if m.higher else ''}", _cells([data[m.metric].get((d, label)) for label in labels],
                                                       m.fmt, None)) for m in metrics]) for d in datasets]
    return Table(name, title, caption, "Metric", labels, sections)


def timing_table(results: Results, model: str) -> Table | None:
    """Paper 000 Table 6: mean attribution seconds per example, rows = methods, columns = datasets + All."""
    times: dict = defaultdict(list)
    for dataset, method, params, _example, _expl, seconds in results.explanations(model):
        times[(dataset, method_label(method, params))].append(seconds)
    if not times:
        return None
    datasets = sorted({d for d, _ in times}, key=dataset_key)
    labels = sorted({label for _, label in times})
    rows = []
    for label in labels:
        per = [mean(times[(d, label)]) if (d, label) in times else None for d in datasets]
        pooled = [t for d in datasets for t in times.get((d, label), [])]
        rows.append((label, _cells([*per, mean(pooled)], ".3f", None)))
    return Table("table6_time", "Table 6: average attribution time per example (seconds)",
                 "Wall time of the attribution method alone (no metric), averaged over the evaluated "
                 "examples. Varies run to run: excluded from report.md and the byte-compared output.",
                 "Method",
                 [*map(dataset_name, datasets), "All"], [Section("Seconds per example ↓", rows)],
                 deterministic=False)


def accuracy_table(results: Results, model: str) -> Table | None:
    """Task accuracy per dataset: share of examples whose predicted label (label-word argmax at the first
    answer position) equals the gold label, from the stored explanations' classification records (one
    vote per example: every method explains the same target)."""
    votes: dict = defaultdict(dict)
    for dataset, _method, _params, example, text, _seconds in results.explanations(model):
        record = json.loads(text).get("classification") or {}
        if record.get("correct") is not None:
            votes[dataset][example] = float(record["correct"])
    if not votes:
        return None
    datasets = sorted(votes, key=dataset_key)
    rows = [("Accuracy", _cells([mean(list(votes[d].values())) for d in datasets], ".3f", None)),
            ("Examples", _cells([len(votes[d]) for d in datasets], "d", None))]
    return Table("table_accuracy", "Task accuracy of the model",
                 "Share of examples whose predicted label word (argmax over the label words at the first "
                 "answer position) equals the gold label: whether the model does the task at all.",
                 "", [*map(dataset_name, datasets)], [Section("Label-word prediction", rows)])


# ---------------------------------------------------------------------------------------- the tables
def paper_tables(results: Results, model: str) -> list[Table]:
    """Every table whose metrics are in the store, in paper order (timings last)."""
    auc = [MetricRow("pi_soft_ns_auc", "AUC π-Soft-NS", True),
           MetricRow("pi_soft_nc_auc", "AUC π-Soft-NC", True)]
    best = "Best / 2nd / 3rd marked on the Avg row."
    tables = [
        accuracy_table(results, model),
        datasets_by_methods(results, model, "table1_pi_soft_auc",
                            "Table 1: AUC of π-Soft-NC/NS curves (dynamic routing)",
                            "Mean over examples of the per-example AUC (trapezoid / span of the π grid). "
                            + best,
                            auc, "dynamic", mark_all_rows=False),
        metrics_by_methods(results, model, "table2_soft",
                           "Table 2: original Soft-NC/NS and E[R] (dynamic routing)",
                           "No transformation of the scores (α = 1); E[R] = expected number of retained "
                           "tokens.",
                           [MetricRow("soft_ns", "Soft-NS", True), MetricRow("soft_nc", "Soft-NC", True),
                            MetricRow("expected_retained", "E[R]", False, ".1f")], "dynamic"),
        datasets_by_methods(results, model, "table8_fixed_routing",
                            "Table 8: AUC of π-Soft-NC/NS curves (fixed routing)",
                            f"Attention probabilities cached from the clean input and replayed. {best}",
                            auc, "fixed", mark_all_rows=False),
        datasets_by_methods(results, model, "table4_deletion_insertion",
                            "Table 4: deletion and insertion AUC",
                            "Flip probability along 5% steps by rank, and its change from the clean input "
                            "(Δ, paper 000 appendix E's quantity); best / 2nd / 3rd marked on every row.",
                            [MetricRow("deletion_auc", "Deletion", True, ".4f"),
                             MetricRow("insertion_auc", "Insertion", False, ".4f"),
                             MetricRow("deletion_change_auc", "Deletion Δ", True, ".4f"),
                             MetricRow("insertion_change_auc", "Insertion Δ", False, ".4f")], "none",
                            mark_all_rows=True),
        methods_by_datasets(results, model, "table_comprehensiveness",
                            "Comprehensiveness (paper 003 Tables 1 and 4)",
                            "Averaged over all perturbation ratios; best / 2nd / 3rd per column.",
                            [MetricRow("comprehensiveness", "Comp CD", True),
                             MetricRow("comprehensiveness_acc", "Comp Acc", False)], "none"),
        methods_by_datasets(results, model, "table_sufficiency", "Sufficiency (paper 003 Tables 5 and 6)",
                            "Averaged over all perturbation ratios; best / 2nd / 3rd per column.",
                            [MetricRow("sufficiency", "Suff CD", False),
                             MetricRow("sufficiency_acc", "Suff Acc", True)], "none"),
        methods_by_datasets(results, model, "table_log_odds", "Log-odds, comprehensiveness and sufficiency "
                            "at the top 20% (paper 004 appendix A.4)", "Best / 2nd / 3rd per column.",
                            [MetricRow("log_odds", "Log-odds", False),
                             MetricRow("comprehensiveness_top_k", "Comprehensiveness", True),
                             MetricRow("sufficiency_top_k", "Sufficiency", False)], "none"),
        timing_table(results, model),
    ]
    return [t for t in tables if t is not None and any(c.value is not None for s in t.sections
                                                          for _, cells in s.rows for c in cells)]


# ---------------------------------------------------------------------------------------- renderers
def to_markdown(table: Table) -> str:
    def cell(c: Cell) -> str:
        text = f"**{c.text}**" if c.rank == 1 else c.text
        return text + MARKS.get(c.rank, "")

    lines = [f"### {table.title}", "", f"| {table.corner} | " + " | ".join(table.columns) + " |",
             "|---|" + "---:|" * len(table.columns)]
    for section in table.sections:
        lines.append(f"| *{section.title}* |" + " |" * len(table.columns))
        lines += [f"| {name} | " + " | ".join(map(cell, cells)) + " |" for name, cells in section.rows]
    legend = " Marks: ¹ best (bold), ² 2nd, ³ 3rd." if table.ranked else ""
    lines += ["", table.caption + legend, ""]
    return "\n".join(lines)


LATEX_ESCAPE = {"_": r"\_", "%": r"\%", "&": r"\&", "#": r"\#", "π": r"$\pi$", "↑": r"$\uparrow$",
                "↓": r"$\downarrow$", "α": r"$\alpha$", "–": "--"}


def latex_escape(text: str) -> str:
    return "".join(LATEX_ESCAPE.get(ch, ch) for ch in text)


def to_latex(table: Table) -> str:
    wrap = {1: r"\textbf{%s}", 2: r"\underline{%s}", 3: r"\textit{%s}"}
    n = len(table.columns)
    lines = [r"\begin{table}[t]", r"\centering", r"\small", r"\begin{tabular}{l" + "r" * n + "}", r"\toprule",
             " & ".join(map(latex_escape, [table.corner, *table.columns])) + r" \\"]
    for section in table.sections:
        title = latex_escape(section.title)
        lines += [r"\midrule", rf"\multicolumn{{{n + 1}}}{{l}}{{\textit{{{title}}}}} \\"]
        for name, cells in section.rows:
            texts = [wrap.get(c.rank, "%s") % latex_escape(c.text) for c in cells]
            lines.append(" & ".join([latex_escape(name), *texts]) + r" \\")
    lines += [r"\bottomrule", r"\end{tabular}",
              rf"\caption{{{latex_escape(table.title)}. {latex_escape(table.caption)}"
              + (r" Best \textbf{bold}, 2nd \underline{underlined}, 3rd \textit{italic}." if table.ranked else "")
              + "}",
              rf"\label{{tab:{table.name}}}", r"\end{table}", ""]
    return "\n".join(lines)


def to_csv(table: Table) -> str:
    """Long form: one line per cell with its section, row, column, formatted value and rank."""
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(["table", "section", "row", "column", "value", "rank"])
    for section in table.sections:
        for name, cells in section.rows:
            for column, c in zip(table.columns, cells, strict=True):
                writer.writerow([table.name, section.title, name, column, "" if c.value is None else c.text,
                                 c.rank or ""])
    return buf.getvalue()


def to_html(table: Table) -> str:
    esc = html.escape
    head = "".join(f"<th>{esc(c)}</th>" for c in [table.corner, *table.columns])
    body = []
    for section in table.sections:
        span = len(table.columns) + 1
        body.append(f'<tr class="section"><td colspan="{span}">{esc(section.title)}</td></tr>')
        for name, cells in section.rows:
            tds = "".join((f'<td class="rank{c.rank}">' if c.rank else "<td>") + f"{esc(c.text)}</td>"
                          for c in cells)
            body.append(f"<tr><th>{esc(name)}</th>{tds}</tr>")
    legend = " Best red, 2nd blue, 3rd green." if table.ranked else ""
    return (f'<figure class="table" id="{table.name}"><figcaption><b>{esc(table.title)}</b>. '
            f"{esc(table.caption)}{legend}</figcaption><table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table></figure>")


def settings_lines(results: Results, model: str) -> list[str]:
    """The run settings of ``model`` as sorted ``key = value`` lines."""
    return [f"{k} = {json.dumps(v)}" for k, v in sorted(results.settings(model).items())]
