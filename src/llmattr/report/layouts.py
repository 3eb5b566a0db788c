"""The paper-shaped tables of ``llmattr report``: the four layouts a metric's :class:`~llmattr.declarations.TableSpec`
names (paper 000 Tables 1/2/4/8, paper 003 Tables 1, 4-6 and Figs. 4-5 as a table), the timing table (Table 6 of
paper 000, marked ``deterministic=False``: wall times vary between runs) and the task accuracy table. The Avg row
is the mean of the dataset means and resamples examples within each dataset. Identical stores give identical
tables, except the timing table.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import Sequence

from .. import stats
from ..declarations import MetricRow, TableSpec, held_out_summary
from ..store import Results
from .head import pearson_table
from .model import (
    Cell,
    Grid,
    Section,
    Stats,
    Table,
    cell_text,
    format_p,
    group_cells,
    layer_grid,
    method_order,
    metric_grid,
)
from .queries import example_values, mean, stored_mc_se
from .trust import trust_tables


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


NO_TESTS = ("No p-values: a paired test needs two methods (or a method and the control) that hold at least two "
            "examples in common.")


def _tests_table(name: str, corner: str, columns: list[str], sections: list[Section], by_row: bool,
                 best: dict, control: tuple[str, ...]) -> Table:
    """The p-value grid under a table: the table's cells (control removed) hold their p vs control; the
    best-vs-2nd p of each group is an extra column (``by_row``) or an extra row per section."""
    keep = [i for i, c in enumerate(columns) if c not in control]
    out = []
    for section in sections:
        rows = []
        for row, cells in section.rows:
            if not by_row and row in control:
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
    labels = method_order((label for _, label in times), cfg.controls)
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
                 deterministic=False, control=tuple(filter(cfg.is_control, labels)))


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
    lines = [f"Model card: {card.get('task')} fine-tune of {card.get('base_model')} ({card.get('loss')} loss, "
             f"seed {card.get('seed')}) on {card.get('n_train')} training rows of "
             f"{data.get('source')}; the evaluation left out every row it was trained on."]
    held = card.get("held_out")
    if held:
        lines.append("Held-out {} at fine-tuning: {}.".format(*held_out_summary(held)))
    return lines


def metric_table(results: Results, model: str, spec: TableSpec, cfg: Stats) -> Table | None:
    """The table ``spec`` (a registered metric's :class:`~llmattr.declarations.TableSpec`) in its layout."""
    rows = list(spec.rows)
    grid = (layer_grid if spec.layout == "layers_by_methods" else metric_grid)(results, model, rows, spec.routing,
                                                                               cfg.controls)
    if grid is None:
        return None
    layout = LAYOUTS[spec.layout]
    corner, columns, sections, best, by_row = layout(grid, rows, cfg, spec.mark_all_rows)
    control = tuple(filter(cfg.is_control, grid[2]))
    tests = _tests_table(spec.name, corner, columns, sections, by_row, best, control)
    tested = any(cell.text not in ("–", "") for section in tests.sections for _, cells in section.rows
                 for cell in cells)
    return Table(spec.name, spec.title, spec.caption, corner, columns, sections, control=control,
                 tests=tests if tested else None,
                 notes=mc_notes(results, model, rows, spec.routing) + ([] if tested else [NO_TESTS]))


LAYOUTS = {"datasets_by_methods": datasets_by_methods, "metrics_by_methods": metrics_by_methods,
           "methods_by_datasets": methods_by_datasets, "layers_by_methods": layers_by_methods}  # declarations.LAYOUTS


def paper_tables(results: Results, model: str, resamples: int = stats.RESAMPLES, *,
                 tables: Sequence[TableSpec], controls: Sequence[str] = ()) -> list[Table]:
    """Task accuracy, then every table of ``tables`` (the registered metrics', in report order) whose
    metrics are in the store, a regression head's Pearson r (:mod:`.head`), then the trust section (:mod:`.trust`:
    where the store holds its metrics), then the
    timings; ``resamples`` bootstrap resamples per confidence interval, every
    method tested against the ``controls`` (:class:`~llmattr.declarations.Catalog`'s)."""
    cfg = Stats(resamples=resamples, controls=tuple(controls))
    built = [accuracy_table(results, model, cfg), *(metric_table(results, model, spec, cfg) for spec in tables),
             pearson_table(results, model, cfg),
             *trust_tables(results, model, cfg, [row for spec in tables for row in spec.rows]),
             timing_table(results, model, cfg)]
    return [t for t in built if t is not None and any(c.value is not None for s in t.sections
                                                         for _, cells in s.rows for c in cells)]
