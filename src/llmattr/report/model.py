"""The report's table model: cells (estimate, interval, tests, rank), sections, tables, and the comparison of
the methods of one group.

Every cell is a mean over its n examples of a per-example value with a 95% bootstrap confidence interval over
examples (:mod:`llmattr.stats`). Methods are compared paired, over the examples both hold: each method against the
Random control, and neighbours in the order of means, Holm-adjusted across the group; a rank mark (best / 2nd /
3rd) is given only where the difference to the method before is significant, otherwise the rank is shared. The
control (a method whose class says so, ``AttributionMethod.control``: Random; :class:`~llmattr.declarations.Catalog`'s
``controls``) has its own (last, grey) column or row, never ranked. Resampling is seeded.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field

from .. import stats
from ..declarations import MetricRow
from ..store import Results
from .queries import example_values, layer_values

MARKS = {1: "¹", 2: "²", 3: "³"}


def is_control(label: str, controls: Collection[str]) -> bool:
    """Whether the method of ``label`` (any parameters) is one of the ``controls`` (method names)."""
    return label.split(":")[0] in controls


def method_order(labels, controls: Collection[str]) -> list[str]:
    """Methods sorted by label, the control(s) last."""
    return sorted(set(labels), key=lambda label: (is_control(label, controls), label))


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
    """How cells are summarised and compared: bootstrap resamples for the intervals, the seed, and the control
    methods every other one is tested against (:class:`~llmattr.declarations.Catalog`'s ``controls``)."""

    resamples: int = stats.RESAMPLES
    seed: int = stats.SEED
    controls: tuple[str, ...] = ()

    def is_control(self, label: str) -> bool:
        """Whether ``label``'s method is one of the controls."""
        return is_control(label, self.controls)


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
    controls = [label for label in labels if cfg.is_control(label) and label in ests]
    cells = {label: Cell(est.mean, cell_text(est, fmt), estimate=est) for label, est in ests.items()}
    for label, cell in cells.items():
        if controls and not cfg.is_control(label):
            cell.p_control = stats.paired_test(data[label], data[controls[0]], seed=cfg.seed)
    best = "–"
    compared = {label: est.mean for label, est in ests.items() if not cfg.is_control(label)}
    if higher is not None and len(compared) > 1:
        ranking = stats.significance_ranks({k: data[k] for k in compared}, compared, higher, seed=cfg.seed)
        for label, p in zip(ranking.order, ranking.p_next, strict=False):
            cells[label].p_next = p
        for label, rank in ranking.ranks.items():
            cells[label].rank = rank if ranked and rank <= 3 else None
        best = f"{format_p(ranking.p_next[0])} ({ranking.order[0]} vs {ranking.order[1]})"
    return [cells.get(label, Cell(None, "–")) for label in labels], best


Grid = tuple[dict, list, list[str], dict]  # per-metric values by (dataset, label); datasets; labels; display names


def metric_grid(results: Results, model: str, metrics: list[MetricRow], routing: str,
                controls: Collection[str]) -> Grid | None:
    """Per-example values of each metric per (dataset, method label), with the sorted datasets and
    labels (control last); None if empty."""
    data = {m.metric: example_values(results, model, m.metric, routing) for m in metrics}
    keys = {key for values in data.values() for key in values}
    if not keys:
        return None
    datasets = sorted({d for d, _ in keys}, key=results.dataset_key)
    labels = method_order((label for _, label in keys), controls)
    return data, datasets, labels, {d: results.dataset_name(d) for d in datasets}


def layer_grid(results: Results, model: str, metrics: list[MetricRow], routing: str,
               controls: Collection[str]) -> Grid | None:
    """Per-layer values of each metric per (layer, method label) as strata by dataset, with the layers and
    the sorted labels (control last); None if no method was stored per layer."""
    data, layers = {}, set()
    for m in metrics:
        data[m.metric], found = layer_values(results, model, m.metric, routing)
        layers.update(found)
    keys = {key for values in data.values() for key in values}
    if not layers:
        return None
    return data, sorted(layers), method_order((label for _, label in keys), controls), {}
