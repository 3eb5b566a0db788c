"""The report's table writers: Markdown, LaTeX, CSV and HTML of a :class:`~llmattr.report.model.Table`, and the
run settings lines."""

from __future__ import annotations

import csv
import html
import io
import json
import re
from collections import defaultdict

from .. import stats
from ..declarations import RULE_VERSIONS, RULES
from ..store import Results
from .model import MARKS, Cell, Table

INTERVALS = "Cells: mean ± half-width of the 95% bootstrap interval over examples (n in the settings)."


RANKS = ("Marks: ¹ best (bold), ² 2nd, ³ 3rd, by paired tests: a method takes the next rank only where it "
         "differs significantly (Holm-adjusted p < 0.05) from the method before it, else it shares that rank.")


def _legend(table: Table, ranks: str) -> str:
    control = f" {', '.join(table.control)} is the control (last, grey): never ranked." if table.control else ""
    intervals = INTERVALS if any(c.estimate for s in table.sections for _, cells in s.rows for c in cells) else ""
    return " ".join(filter(None, [table.caption, intervals, ranks if table.ranked else "", control.strip()]))


def _md_grid(table: Table) -> list[str]:
    def cell(c: Cell, control: bool) -> str:
        text = f"**{c.text}**" if c.rank == 1 else f"*{c.text}*" if control and c.value is not None else c.text
        return text + MARKS.get(c.rank, "")

    def head(name: str) -> str:
        return f"{name} (control)" if name in table.control else name

    lines = [f"| {table.corner} | " + " | ".join(map(head, table.columns)) + " |",
             "|---|" + "---:|" * len(table.columns)]
    for section in table.sections:
        lines.append(f"| *{section.title}* |" + " |" * len(table.columns))
        lines += [f"| {head(name)} | " + " | ".join(cell(c, name in table.control or col in table.control)
                                                    for col, c in zip(table.columns, cells, strict=True)) + " |"
                  for name, cells in section.rows]
    return lines


def to_markdown(table: Table) -> str:
    lines = [f"### {table.title}", "", *_md_grid(table), "", _legend(table, RANKS), ""]
    lines += [*table.notes, ""] if table.notes else []
    if table.tests is not None:
        lines += [f"{table.title.split(':')[0]}, p-values. {table.tests.caption}", "", *_md_grid(table.tests), ""]
    return "\n".join(lines)


LATEX_ESCAPE = {"_": r"\_", "%": r"\%", "&": r"\&", "#": r"\#", "π": r"$\pi$", "↑": r"$\uparrow$",
                "↓": r"$\downarrow$", "α": r"$\alpha$", "–": "--", "±": r"$\pm$", "<": r"$<$"}


def latex_escape(text: str) -> str:
    return "".join(LATEX_ESCAPE.get(ch, ch) for ch in text)


def to_latex(table: Table) -> str:
    """A ``table`` environment (booktabs; the control in ``\\textcolor{gray}``, which needs xcolor), then
    the p-value grid as a second one."""
    wrap = {1: r"\textbf{%s}", 2: r"\underline{%s}", 3: r"\textit{%s}"}
    grey = r"\textcolor{gray}{%s}"
    n = len(table.columns)
    lines = [r"\begin{table}[t]", r"\centering", r"\small", r"\begin{tabular}{l" + "r" * n + "}", r"\toprule",
             " & ".join(latex_escape(c) if c not in table.control else grey % latex_escape(c)
                        for c in [table.corner, *table.columns]) + r" \\"]
    for section in table.sections:
        title = latex_escape(section.title)
        lines += [r"\midrule", rf"\multicolumn{{{n + 1}}}{{l}}{{\textit{{{title}}}}} \\"]
        for name, cells in section.rows:
            texts = [(grey if name in table.control or col in table.control else wrap.get(c.rank, "%s"))
                     % latex_escape(c.text) for col, c in zip(table.columns, cells, strict=True)]
            lines.append(" & ".join([latex_escape(name), *texts]) + r" \\")
    ranks = (" Best \\textbf{bold}, 2nd \\underline{underlined}, 3rd \\textit{italic}; equal marks: not "
             "significantly different (paired test, Holm, 0.05).") if table.ranked else ""
    notes = "".join(f" {latex_escape(note)}" for note in table.notes)
    lines += [r"\bottomrule", r"\end{tabular}",
              rf"\caption{{{latex_escape(_unnumbered(table.title))}. "
              rf"{latex_escape(_legend(table, ''))}{ranks}{notes}}}",
              rf"\label{{tab:{table.name}}}", r"\end{table}", ""]
    return "\n".join(lines) + (to_latex(table.tests) if table.tests is not None else "")


def _unnumbered(title: str) -> str:
    """A title without its "Table N: " (LaTeX numbers the caption itself: "Table 1: Table 1: ..." otherwise)."""
    numbered = re.match(r"Table \d+:\s*", title)
    return title[numbered.end():][:1].upper() + title[numbered.end() + 1:] if numbered else title


def _number(x: float | None, digits: str = ".6g") -> str:
    return "" if x is None else format(x, digits)


def to_csv(table: Table) -> str:
    """Long form: one line per cell: mean, 95% interval, n, rank, p vs the control, p vs the next method."""
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(["table", "section", "row", "column", "mean", "ci_low", "ci_high", "n", "rank",
                     "p_vs_control", "p_vs_next"])
    for section in table.sections:
        for name, cells in section.rows:
            for column, c in zip(table.columns, cells, strict=True):
                est = c.estimate
                writer.writerow([table.name, section.title, name, column, _number(c.value),
                                 _number(est and est.low), _number(est and est.high), est.n if est else "",
                                 c.rank or "", _number(c.p_control, ".4g"), _number(c.p_next, ".4g")])
    return buf.getvalue()


def _html_grid(table: Table) -> str:
    esc = html.escape
    head = "".join(f'<th class="control">{esc(c)}</th>' if c in table.control else f"<th>{esc(c)}</th>"
                   for c in [table.corner, *table.columns])
    body = []
    for section in table.sections:
        span = len(table.columns) + 1
        body.append(f'<tr class="section"><td colspan="{span}">{esc(section.title)}</td></tr>')
        for name, cells in section.rows:
            tds = "".join(('<td class="control">' if name in table.control or col in table.control else
                           f'<td class="rank{c.rank}">' if c.rank else "<td>") + f"{esc(c.text)}</td>"
                          for col, c in zip(table.columns, cells, strict=True))
            row_head = f'<th class="control">{esc(name)}</th>' if name in table.control else f"<th>{esc(name)}</th>"
            body.append(f"<tr>{row_head}{tds}</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def to_html(table: Table) -> str:
    esc = html.escape
    legend = " Best red, 2nd blue, 3rd green; equal colours: not significantly different." if table.ranked else ""
    notes = "".join(f'<p class="meta">{esc(note)}</p>' for note in table.notes)
    tests = "" if table.tests is None else (f'<details><summary>p-values</summary><p class="meta">'
                                            f"{esc(table.tests.caption)}</p>{_html_grid(table.tests)}</details>")
    return (f'<figure class="table" id="{table.name}"><figcaption><b>{esc(table.title)}</b>. '
            f"{esc(_legend(table, ''))}{legend}</figcaption>{_html_grid(table)}{notes}{tests}</figure>")


def settings_lines(results: Results, model: str, resamples: int = stats.RESAMPLES) -> list[str]:
    """The run settings of ``model`` as sorted ``key = value`` lines with their effective values (a
    task-default ``max_new_tokens`` as the steps explained per dataset), then the examples per dataset
    and the statistics used."""
    steps: dict = defaultdict(set)
    examples: dict = defaultdict(set)
    for dataset, _method, _params, example, text, _seconds in results.explanations(model):
        examples[dataset].add(example)
        steps[dataset].add(len(json.loads(text)["steps"]))
    datasets = sorted(examples, key=results.dataset_key)
    name = results.dataset_name
    effective = {"max_new_tokens": "task default (steps explained: " + ", ".join(
        f"{name(d)} {'-'.join(map(str, sorted({min(steps[d]), max(steps[d])})))}" for d in datasets) + ")",
                 "n_layers": "unknown"}
    lines = [f"{k} = {json.dumps(v) if v is not None else effective.get(k, 'default')}"
             + (f" ({RULE_VERSIONS[k, v]})" if k in RULES and (k, v) in RULE_VERSIONS else "")
             for k, v in sorted(results.settings(model).items())]
    lines.append("examples (n) = " + ", ".join(f"{results.dataset_name(d)} {len(examples[d])}" for d in datasets))
    lines.append(f"statistics = mean over examples, 95% BCa bootstrap interval ({resamples} resamples, seed "
                 f"{stats.SEED}; Avg rows resample within datasets); paired sign-flip permutation tests "
                 f"({stats.PERMUTATIONS} resamples, two-sided); ranks at Holm-adjusted p < {stats.ALPHA}")
    return lines
