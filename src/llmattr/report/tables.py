"""The paper-shaped tables of ``llmattr report``, built from merged stores and rendered as md/LaTeX/CSV/HTML.

Every cell is a mean over its n examples of a per-example value (a per-example value is itself the mean
over its generation steps and, for curve metrics summarised by one number, over the curve's points),
summed with :func:`math.fsum` so the result does not depend on the order rows were written in (shards,
resumed runs), with a 95% bootstrap confidence interval over examples; the Avg row is the mean of the
dataset means and resamples examples within each dataset (:mod:`llmattr.stats`). Methods are compared
paired, over the examples both hold: each method against the Random control (its p-value is shown under
the table), and neighbours in the order of means, Holm-adjusted across the row; a rank mark (best / 2nd /
3rd) is given only where the difference to the method before is significant, otherwise the rank is
shared. Random is the control: its own (last, grey) column or row, never ranked. Resampling is seeded,
so the output is byte-identical for identical stores, except the timing table (:func:`timing_table`,
Table 6 of paper 000), which is marked ``deterministic=False``.
"""

from __future__ import annotations

import csv
import html
import io
import json
import math
import re
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from .. import stats
from ..specs import MetricRow, TableSpec
from ..store import NONE, Results

MARKS = {1: "¹", 2: "²", 3: "³"}
CONTROL = "random"  # the method every other one is tested against; never ranked


def mean(values: list[float]) -> float:
    return math.fsum(values) / len(values)


def is_control(label: str) -> bool:
    """The Random baseline (any parameters) is the control."""
    return label.split(":")[0] == CONTROL


def method_order(labels) -> list[str]:
    """Methods sorted by label, the control(s) last."""
    return sorted(set(labels), key=lambda label: (is_control(label), label))


# ---------------------------------------------------------------------------------------- aggregation
def per_example(results: Results, model: str, metric: str, routing: str) -> dict[tuple, dict[str, dict]]:
    """``{(dataset, label): {example: {pi: value}}}``, each value the mean over generation steps."""
    acc: dict = defaultdict(lambda: defaultdict(lambda: defaultdict(list)))
    for dataset, method, params, example, pi, _step, value, _se in results.values(model, metric, routing):
        acc[(dataset, results.label(method, params))][example][pi].append(value)
    return {key: {ex: {pi: mean(v) for pi, v in points.items()} for ex, points in examples.items()}
            for key, examples in acc.items()}


def example_values(results: Results, model: str, metric: str, routing: str) -> dict[tuple, dict[str, float]]:
    """``{(dataset, label): {example: value}}``: each example's value (mean over its curve points)."""
    return {key: {ex: mean(list(points.values())) for ex, points in examples.items()}
            for key, examples in per_example(results, model, metric, routing).items()}


def scalar_means(results: Results, model: str, metric: str, routing: str) -> dict[tuple, float]:
    """``{(dataset, label): mean over examples}`` of each example's value (mean over its curve points)."""
    return {key: mean(list(examples.values()))
            for key, examples in example_values(results, model, metric, routing).items()}


def curve_values(results: Results, model: str, metric: str, routing: str) -> dict[tuple, dict[float, dict]]:
    """``{(dataset, label): {pi: {example: value}}}`` for curve metrics (rows with pi != -1)."""
    out: dict = {}
    for key, examples in per_example(results, model, metric, routing).items():
        by_pi: dict = defaultdict(dict)
        for example, points in examples.items():
            for pi, value in points.items():
                if pi != NONE:
                    by_pi[pi][example] = value
        if by_pi:
            out[key] = dict(sorted(by_pi.items()))
    return out


def stored_mc_se(results: Results, model: str, metric: str, routing: str) -> dict[tuple, list[float]]:
    """``{(dataset, label): [Monte-Carlo standard error of each example]}`` of a scalar metric as stored (the
    stored ``mc_se`` of its rows; metrics without one are absent)."""
    out: dict = defaultdict(list)
    for dataset, method, params, _example, pi, _step, _value, se in results.values(model, metric, routing):
        if se is not None and pi == NONE:
            out[(dataset, results.label(method, params))].append(se)
    return dict(out)


# ---------------------------------------------------------------------------------------- table model
@dataclass
class Cell:
    """One table cell: mean (``value``) with its interval, rank mark, p-value vs the control and the
    Holm-adjusted p-value vs the next method in the row's order of means."""

    value: float | None
    text: str
    rank: int | None = None
    estimate: stats.Estimate | None = None
    p_control: float | None = None
    p_next: float | None = None


@dataclass
class Section:
    title: str
    rows: list[tuple[str, list[Cell]]]


@dataclass
class Table:
    """A titled grid with sections (e.g. one per metric); ``rank`` 1-3 marks best/2nd/3rd.

    ``control`` names the control's column or row (grey, never ranked); ``tests`` is the grid of paired
    test p-values shown under the table; ``notes`` are extra lines (Monte-Carlo error) under it.
    """

    name: str
    title: str
    caption: str
    corner: str
    columns: list[str]
    sections: list[Section]
    deterministic: bool = True
    control: tuple[str, ...] = ()
    tests: Table | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def ranked(self) -> bool:
        return any(c.rank for s in self.sections for _, cells in s.rows for c in cells)


@dataclass(frozen=True)
class Stats:
    """How cells are summarised: bootstrap resamples for the intervals, and the seed."""

    resamples: int = stats.RESAMPLES
    seed: int = stats.SEED


def format_p(p: float | None) -> str:
    return "–" if p is None else "<0.001" if p < 0.001 else f"{p:.3f}"


def cell_text(est: stats.Estimate | None, fmt: str) -> str:
    """``0.424 ± 0.031`` (mean ± half-width of the 95% interval); the mean alone below two examples."""
    if est is None:
        return "–"
    if est.half_width is None:
        return format(est.mean, fmt)
    return f"{format(est.mean, fmt)} ± {format(est.half_width, fmt)}"


def group_cells(data: Mapping[str, stats.Strata | None], labels: list[str], fmt: str, higher: bool | None,
                ranked: bool, cfg: Stats) -> tuple[list[Cell], str]:
    """Cells of one comparison group (a row of Table 1, a column of the comp/suff tables): estimate of
    every method, its paired test vs the control, and, when ``higher`` gives a direction, the order of
    the methods with Holm-adjusted neighbour tests (rank marks if ``ranked``). Also returns the
    "best vs 2nd" text of the group."""
    ests = {label: stats.estimate(data[label], cfg.resamples, cfg.seed) for label in labels if data.get(label)}
    controls = [label for label in labels if is_control(label) and label in ests]
    cells = {label: Cell(est.mean, cell_text(est, fmt), estimate=est) for label, est in ests.items()}
    for label, cell in cells.items():
        if controls and not is_control(label):
            cell.p_control = stats.paired_test(data[label], data[controls[0]], seed=cfg.seed)
    best = "–"
    compared = {label: est.mean for label, est in ests.items() if not is_control(label)}
    if higher is not None and len(compared) > 1:
        ranking = stats.significance_ranks({k: data[k] for k in compared}, compared, higher, seed=cfg.seed)
        for label, p in zip(ranking.order, ranking.p_next, strict=False):
            cells[label].p_next = p
        for label, rank in ranking.ranks.items():
            cells[label].rank = rank if ranked and rank <= 3 else None
        best = f"{format_p(ranking.p_next[0])} ({ranking.order[0]} vs {ranking.order[1]})"
    return [cells.get(label, Cell(None, "–")) for label in labels], best


Grid = tuple[dict, list, list[str], dict]  # per-metric values by (dataset, label); datasets; labels; display names


def metric_grid(results: Results, model: str, metrics: list[MetricRow], routing: str) -> Grid | None:
    """Per-example values of each metric per (dataset, method label), with the sorted datasets and
    labels (control last); None if empty."""
    data = {m.metric: example_values(results, model, m.metric, routing) for m in metrics}
    keys = {key for values in data.values() for key in values}
    if not keys:
        return None
    datasets = sorted({d for d, _ in keys}, key=results.dataset_key)
    return data, datasets, method_order(label for _, label in keys), {d: results.dataset_name(d) for d in datasets}


def layer_values(results: Results, model: str, metric: str, routing: str) -> tuple[dict[tuple, dict], list[int]]:
    """``{(layer, label): {dataset: {example: value}}}`` of a per-layer metric (the stored ``pi`` is the layer
    number) and the sorted layers; a method stored without layers (``pi`` = -1: Random) is repeated at each."""
    by_pi = per_example(results, model, metric, routing)
    layers = sorted({int(pi) for examples in by_pi.values() for points in examples.values() for pi in points
                     if pi != NONE})
    out: dict = defaultdict(lambda: defaultdict(dict))
    for (dataset, label), examples in by_pi.items():
        for example, points in examples.items():
            for pi, value in points.items():
                for layer in layers if pi == NONE else [int(pi)]:
                    out[(layer, label)][dataset][example] = value
    return {key: dict(strata) for key, strata in out.items()}, layers


def layer_grid(results: Results, model: str, metrics: list[MetricRow], routing: str) -> Grid | None:
    """Per-layer values of each metric per (layer, method label) as strata by dataset, with the layers and
    the sorted labels (control last); None if no method was stored per layer."""
    data, layers = {}, set()
    for m in metrics:
        data[m.metric], found = layer_values(results, model, m.metric, routing)
        layers.update(found)
    keys = {key for values in data.values() for key in values}
    if not layers:
        return None
    return data, sorted(layers), method_order(label for _, label in keys), {}


def mc_notes(results: Results, model: str, metrics: list[MetricRow], routing: str) -> list[str]:
    """"Monte-Carlo error" lines: mean over examples of the per-example MC standard error, beside the
    standard deviation over examples, per metric (only metrics stored with an MC error)."""
    parts = []
    for m in metrics:
        errors = [se for values in stored_mc_se(results, model, m.metric, routing).values() for se in values]
        if errors:
            spread = [math.sqrt(sum((v - mean(list(ex.values()))) ** 2 for v in ex.values()) / (len(ex) - 1))
                      for ex in example_values(results, model, m.metric, routing).values() if len(ex) > 1]
            sd = f", SD over examples {format(mean(spread), m.fmt)}" if spread else ""
            parts.append(f"{m.title} {format(mean(errors), m.fmt)}{sd}")
    return [f"Mean Monte-Carlo standard error per example: {'; '.join(parts)}."] if parts else []


TESTS_CAPTION = ("Paired two-sided sign-flip permutation test over the examples both methods hold "
                 "(scipy.stats.permutation_test, H0: equal means): p-value of each method vs the control; "
                 "1st vs 2nd: the best method vs the next, Holm-adjusted across the row's neighbour "
                 "comparisons.")


def _tests_table(name: str, corner: str, columns: list[str], sections: list[Section], by_row: bool,
                 best: dict) -> Table:
    """The p-value grid under a table: the table's cells (control removed) hold their p vs control; the
    best-vs-2nd p of each group is an extra column (``by_row``) or an extra row per section."""
    keep = [i for i, c in enumerate(columns) if not is_control(c)]
    out = []
    for section in sections:
        rows = []
        for row, cells in section.rows:
            if not by_row and is_control(row):
                continue
            texts = [Cell(cells[i].p_control, format_p(cells[i].p_control)) for i in (keep if by_row
                                                                                       else range(len(cells)))]
            if by_row:
                texts.append(Cell(None, best[(section.title, row)]))
            rows.append((row, texts))
        if not by_row:
            rows.append(("1st vs 2nd", [Cell(None, best[(section.title, c)]) for c in columns]))
        out.append(Section(section.title, rows))
    cols = [columns[i] for i in keep] + ["1st vs 2nd"] if by_row else columns
    return Table(f"{name}_tests", "p-values", TESTS_CAPTION, corner, cols, out)


def dataset_groups(values: dict, m: MetricRow, datasets: list[str], labels: list[str], ranked: bool, cfg: Stats,
                   best: dict, section: str, names: dict[str, str]) -> list[list[Cell]]:
    """The cells of metric ``m`` for each dataset, one comparison group per dataset (its "best vs 2nd" text
    goes into ``best[(section, dataset)]``)."""
    out = []
    for d in datasets:
        group = {label: {d: values[(d, label)]} for label in labels if (d, label) in values}
        cells, best[(section, names[d])] = group_cells(group, labels, m.fmt, m.higher, ranked, cfg)
        out.append(cells)
    return out


def datasets_by_methods(grid: Grid, metrics: list[MetricRow], cfg: Stats,
                        mark_all_rows: bool) -> tuple[str, list[str], list[Section], dict, bool]:
    """Paper 000 Tables 1/4/8: one section per metric, rows = datasets + Avg, columns = methods.

    ``mark_all_rows``: best/2nd/3rd on every row (Table 4), else on the Avg row only (Tables 1, 8). The
    Avg cell of a method (only when it has every dataset) resamples within datasets.
    """
    data, datasets, labels, names = grid
    sections, best = [], {}
    for m in metrics:
        values = data[m.metric]
        section = f"{m.title} {'↑' if m.higher else '↓'}"
        rows = list(zip(map(names.get, datasets),
                        dataset_groups(values, m, datasets, labels, mark_all_rows, cfg, best, section, names),
                        strict=True))
        avg = {label: {d: values[(d, label)] for d in datasets} for label in labels
               if all((d, label) in values for d in datasets)}
        cells, best[(section, "Avg")] = group_cells(avg, labels, m.fmt, m.higher, True, cfg)
        rows.append(("Avg", cells))
        sections.append(Section(section, rows))
    return "Dataset", labels, sections, best, True


def methods_by_datasets(grid: Grid, metrics: list[MetricRow], cfg: Stats,
                        mark_all_rows: bool) -> tuple[str, list[str], list[Section], dict, bool]:
    """Paper 003 Tables 1, 4-6: rows = methods, columns = datasets, a section per metric, ranks per column."""
    data, datasets, labels, names = grid
    sections, best = [], {}
    for m in metrics:
        section = f"{m.title} {'↑' if m.higher else '↓'}"
        columns = dataset_groups(data[m.metric], m, datasets, labels, True, cfg, best, section, names)
        sections.append(Section(section, [(label, [col[i] for col in columns]) for i, label in enumerate(labels)]))
    return "Method", [names[d] for d in datasets], sections, best, False


def layers_by_methods(grid: Grid, metrics: list[MetricRow], cfg: Stats,
                      mark_all_rows: bool) -> tuple[str, list[str], list[Section], dict, bool]:
    """Paper 003 Figs. 4-5 as a table: a section per metric, rows = layers, columns = methods; a cell pools the
    datasets (mean of the dataset means, bootstrap within datasets), ranks per row with ``mark_all_rows``."""
    data, layers, labels, _ = grid
    sections, best = [], {}
    for m in metrics:
        section = f"{m.title} {'↑' if m.higher else '↓'}"
        rows = []
        for layer in layers:
            group = {label: data[m.metric][(layer, label)] for label in labels if (layer, label) in data[m.metric]}
            cells, best[(section, f"Layer {layer}")] = group_cells(group, labels, m.fmt, m.higher, mark_all_rows,
                                                                   cfg)
            rows.append((f"Layer {layer}", cells))
        sections.append(Section(section, rows))
    return "Layer", labels, sections, best, True


def metrics_by_methods(grid: Grid, metrics: list[MetricRow], cfg: Stats,
                       mark_all_rows: bool) -> tuple[str, list[str], list[Section], dict, bool]:
    """Paper 000 Table 2: a section per dataset, rows = Soft-NS, Soft-NC, E[R], columns = methods (no
    marks, as in the paper; p-values vs the control and best vs 2nd for the ↑ metrics)."""
    data, datasets, labels, names = grid
    sections, best = [], {}
    for d in datasets:
        rows = []
        for m in metrics:
            row = f"{m.title}{' ↑' if m.higher else ''}"
            group = {label: {d: data[m.metric][(d, label)]} for label in labels if (d, label) in data[m.metric]}
            cells, best[(names[d], row)] = group_cells(group, labels, m.fmt, True if m.higher else None,
                                                              False, cfg)
            rows.append((row, cells))
        sections.append(Section(names[d], rows))
    return "Metric", labels, sections, best, True


def timing_table(results: Results, model: str, cfg: Stats = Stats()) -> Table | None:
    """Paper 000 Table 6: mean attribution seconds per example, rows = methods, columns = datasets + All
    (the pooled examples), with bootstrap intervals."""
    times: dict = defaultdict(dict)
    for dataset, method, params, example, _expl, seconds in results.explanations(model):
        times[(dataset, results.label(method, params))][example] = seconds
    if not times:
        return None
    datasets = sorted({d for d, _ in times}, key=results.dataset_key)
    labels = method_order(label for _, label in times)
    rows = []
    for label in labels:
        per = [{d: times[(d, label)]} if (d, label) in times else None for d in datasets]
        pooled = {"all": {f"{d}/{ex}": t for d in datasets for ex, t in times.get((d, label), {}).items()}}
        cells = [Cell(None, "–") if s is None else
                 Cell((est := stats.estimate(s, cfg.resamples, cfg.seed)).mean, cell_text(est, ".3f"), estimate=est)
                 for s in [*per, pooled]]
        rows.append((label, cells))
    return Table("table6_time", "Table 6: average attribution time per example (seconds)",
                 "Wall time of the attribution method alone (no metric), averaged over the evaluated "
                 "examples. Varies run to run: excluded from report.md and the byte-compared output.",
                 "Method",
                 [*map(results.dataset_name, datasets), "All"], [Section("Seconds per example ↓", rows)],
                 deterministic=False, control=tuple(filter(is_control, labels)))


def accuracy_table(results: Results, model: str, cfg: Stats = Stats()) -> Table | None:
    """Task accuracy per dataset: share of examples whose predicted label (label-word argmax at the first
    answer position) equals the gold label, from the stored explanations' classification records (one
    vote per example: every method explains the same target), with its bootstrap interval."""
    votes: dict = defaultdict(dict)
    for dataset, _method, _params, example, text, _seconds in results.explanations(model):
        record = json.loads(text).get("classification") or {}
        if record.get("correct") is not None:
            votes[dataset][example] = float(record["correct"])
    if not votes:
        return None
    datasets = sorted(votes, key=results.dataset_key)
    estimates = [stats.estimate({d: votes[d]}, cfg.resamples, cfg.seed) for d in datasets]
    rows = [("Accuracy", [Cell(e.mean, cell_text(e, ".3f"), estimate=e) for e in estimates]),
            ("Examples", [Cell(e.n, str(e.n)) for e in estimates])]
    return Table("table_accuracy", "Task accuracy of the model",
                 "Share of examples whose predicted label word (argmax over the label words at the first "
                 "answer position) equals the gold label: whether the model does the task at all.",
                 "", [*map(results.dataset_name, datasets)], [Section("Label-word prediction", rows)],
                 notes=card_notes(results.settings(model).get("model_card")))


def card_notes(card: dict | None) -> list[str]:
    """The facts of a fine-tuned model's card (``llmattr finetune``), shown under the accuracy table."""
    if not card:
        return []
    data = card.get("data", {})
    lines = [f"Model card: {card.get('task')} fine-tune of {card.get('base_model')} (objective "
             f"{card.get('objective')}, seed {card.get('seed')}) on {card.get('n_train')} training rows of "
             f"{data.get('source')}; the evaluation left out every row it was trained on."]
    held = card.get("held_out")
    if held:
        lines.append(f"Held-out accuracy at fine-tuning: {held['accuracy']:.3f} (95% CI {held['low']:.3f}-"
                     f"{held['high']:.3f}, n={held['n']}; majority class {held['majority']:.3f}).")
    return lines


# ---------------------------------------------------------------------------------------- the tables
def metric_table(results: Results, model: str, spec: TableSpec, cfg: Stats) -> Table | None:
    """The table ``spec`` (a registered metric's :class:`~llmattr.specs.TableSpec`) in its layout."""
    rows = list(spec.rows)
    grid = (layer_grid if spec.layout == "layers_by_methods" else metric_grid)(results, model, rows, spec.routing)
    if grid is None:
        return None
    layout = LAYOUTS[spec.layout]
    corner, columns, sections, best, by_row = layout(grid, rows, cfg, spec.mark_all_rows)
    labels = grid[2]
    return Table(spec.name, spec.title, spec.caption, corner, columns, sections,
                 control=tuple(filter(is_control, labels)),
                 tests=_tests_table(spec.name, corner, columns, sections, by_row, best),
                 notes=mc_notes(results, model, rows, spec.routing))


LAYOUTS = {"datasets_by_methods": datasets_by_methods, "metrics_by_methods": metrics_by_methods,
           "methods_by_datasets": methods_by_datasets, "layers_by_methods": layers_by_methods}  # specs.LAYOUTS


def paper_tables(results: Results, model: str, resamples: int = stats.RESAMPLES, *,
                 tables: Sequence[TableSpec]) -> list[Table]:
    """Task accuracy, then every table of ``tables`` (the registered metrics', in report order) whose
    metrics are in the store, then the timings; ``resamples`` bootstrap resamples per confidence interval."""
    cfg = Stats(resamples=resamples)
    built = [accuracy_table(results, model, cfg), *(metric_table(results, model, spec, cfg) for spec in tables),
             timing_table(results, model, cfg)]
    return [t for t in built if t is not None and any(c.value is not None for s in t.sections
                                                         for _, cells in s.rows for c in cells)]


# ---------------------------------------------------------------------------------------- renderers
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
             for k, v in sorted(results.settings(model).items())]
    lines.append("examples (n) = " + ", ".join(f"{results.dataset_name(d)} {len(examples[d])}" for d in datasets))
    lines.append(f"statistics = mean over examples, 95% BCa bootstrap interval ({resamples} resamples, seed "
                 f"{stats.SEED}; Avg rows resample within datasets); paired sign-flip permutation tests "
                 f"({stats.PERMUTATIONS} resamples, two-sided); ranks at Holm-adjusted p < {stats.ALPHA}")
    return lines
