"""Paper 003's STS-B measure in ``llmattr report``: a regression head's comprehensiveness and sufficiency "Acc"
(eqs. 6 and 8) is Pearson's correlation, over the examples, of the head's output with the top K% tokens deleted
(``comprehensiveness_output``) or kept alone (``sufficiency_output``) with the gold scores (``gold_score``), at every
ratio K; its Table 1 cell is the mean of r over K. Intervals: 95% percentile bootstrap over examples (the same
resample for every K); p vs the control: a paired bootstrap (the share of resamples whose difference of the mean r
crosses 0, doubled).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from .. import stats
from ..declarations import MetricRow
from ..plotting import method_colors
from ..store import Results
from .figures import Figure, n_text, plot_curves
from .model import Cell, Section, Stats, Table, cell_text, format_p, is_control, method_order
from .queries import per_example

PEARSON_ROWS = (MetricRow("comprehensiveness", "Comp Pearson r", False),  # the lower, the more comprehensive
                MetricRow("sufficiency", "Suff Pearson r", True))


def regression_outputs(results: Results, model: str, key: str) -> dict[tuple, dict]:
    """``{(dataset, label): {"x": [K...], "outputs": (n, K), "gold": (n,)}}`` over the examples holding both the
    outputs of ``key`` (``comprehensiveness`` or ``sufficiency``) and a gold score."""
    outputs = per_example(results, model, f"{key}_output", "none")
    gold = per_example(results, model, "gold_score", "none")
    out = {}
    for group, examples in outputs.items():
        held = sorted(set(examples) & set(gold.get(group, {})))
        if len(held) < 3:
            continue
        xs = sorted(examples[held[0]])
        out[group] = {"x": xs, "outputs": np.array([[examples[e][x] for x in xs] for e in held]),
                      "gold": np.array([next(iter(gold[group][e].values())) for e in held])}
    return out


def mean_r(data: dict, rows: np.ndarray) -> np.ndarray:
    """The mean over K of Pearson's r on each resample ``rows`` ``(B, n)``: ``(B,)`` (NaN where a resample's outputs
    or scores are constant at every K)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return np.nanmean(stats.pearson_columns(data["outputs"][rows], data["gold"][rows]), -1)


def pearson_table(results: Results, model: str, cfg: Stats = Stats()) -> Table | None:
    """Table 1's STS-B column: rows = methods, columns = datasets, a section per criterion, each cell the mean over K
    of Pearson's r with its 95% bootstrap interval and the p-value vs the control under the table."""
    per_key = {m.metric: regression_outputs(results, model, m.metric) for m in PEARSON_ROWS}
    groups = {g for values in per_key.values() for g in values}
    if not groups:
        return None
    datasets = sorted({d for d, _ in groups}, key=results.dataset_key)
    labels = method_order((label for _, label in groups), cfg.controls)
    control = next((label for label in labels if is_control(label, cfg.controls)), None)
    sections, tests = [], []
    for m in PEARSON_ROWS:
        rows, p_rows = {label: [] for label in labels}, {label: [] for label in labels}
        for d in datasets:
            n = max((len(v["gold"]) for (dd, _), v in per_key[m.metric].items() if dd == d), default=0)
            resamples = np.random.default_rng(cfg.seed).integers(0, n, size=(cfg.resamples, n)) if n else None
            boots = {label: mean_r(per_key[m.metric][(d, label)], resamples) for label in labels
                     if (d, label) in per_key[m.metric] and len(per_key[m.metric][(d, label)]["gold"]) == n}
            for label in labels:
                if label not in boots:
                    rows[label].append(Cell(None, "–"))
                    p_rows[label].append(Cell(None, "–"))
                    continue
                data = per_key[m.metric][(d, label)]
                est = stats.Estimate(float(mean_r(data, np.arange(n)[None])[0]),
                                     float(np.nanquantile(boots[label], 0.025)),
                                     float(np.nanquantile(boots[label], 0.975)), n)
                p = None
                if control in boots and label != control:
                    diff = boots[label] - boots[control]
                    p = min(1.0, max(2 * min((diff <= 0).mean(), (diff >= 0).mean()), 1 / cfg.resamples))
                rows[label].append(Cell(est.mean, cell_text(est, ".3f"), estimate=est, p_control=p))
                p_rows[label].append(Cell(p, format_p(p)))
        title = f"{m.title} {'↑' if m.higher else '↓'}"
        sections.append(Section(title, list(rows.items())))
        tests.append(Section(title, [(label, cells) for label, cells in p_rows.items() if label != control]))
    columns = [results.dataset_name(d) for d in datasets]
    caption = ("A regression head (paper 003's STS-B): Pearson's r of the head's output with the top K% tokens "
               "deleted (Comp) or kept alone (Suff) with the gold scores, averaged over K = 10..90%; 95% bootstrap "
               "interval over examples.")
    return Table("table_pearson", "Comprehensiveness and sufficiency of a regression head: Pearson r "
                 "(paper 003 Table 1, STS-B)", caption, "Method", columns, sections,
                 control=(control,) if control else (),
                 tests=Table("table_pearson_tests", "p-values", "Paired bootstrap over examples: twice the share "
                             "of resamples whose difference of the mean r from the control crosses 0.", "Method",
                             columns, tests))


def pearson_figures(results: Results, model: str, out: Path, resamples: int = stats.RESAMPLES,
                    controls: Sequence[str] = (), seed: int = 0) -> list[Figure]:
    """Paper 003 Figs. 2-3 for a regression head: Pearson's r against K per dataset, a panel per criterion, a line per
    method with its 95% bootstrap band over examples (:func:`llmattr.stats.pearson_curve`)."""
    per_key = {m.metric: regression_outputs(results, model, m.metric) for m in PEARSON_ROWS}
    groups = {g for values in per_key.values() for g in values}
    colors = method_colors(label for _, label in groups)
    figures = []
    for dataset in sorted({d for d, _ in groups}, key=results.dataset_key):
        labels = method_order((label for d, label in groups if d == dataset), controls)
        panels = [(m, {label: stats.pearson_curve(data["outputs"], data["gold"], data["x"], resamples, seed)
                       for label in labels if (data := per_key[m.metric].get((dataset, label)))})
                  for m in PEARSON_ROWS]
        n = n_text(len(v["gold"]) for values in per_key.values() for (d, _), v in values.items() if d == dataset)
        path = plot_curves(panels, out / f"fig2_comp_suff_pearson_{dataset}.png",
                           f"Pearson r vs K (paper 003 Figs. 2-3), {results.dataset_name(dataset)}, {model} ({n})",
                           "K (ratio of tokens perturbed)", colors, controls)
        figures.append(Figure(path, f"Pearson's r of a regression head's output with the gold scores at each "
                                    f"perturbation ratio K on {results.dataset_name(dataset)}: {n} examples per "
                                    "method, band = 95% bootstrap interval over examples."))
    return figures
