"""PNG figures of ``llmattr report`` (paper 000 Figs. 3, 5, 6; paper 003 Figs. 2-5), written byte-reproducibly.

The Agg backend renders deterministically; PNG metadata carries no software version or date, so an
identical store gives identical files. Means carry 95% bootstrap intervals over examples (a band on the
pi-curves, error bars on the layer sweep; :mod:`llmattr.stats`, seeded) and every caption gives n.
"""

from __future__ import annotations

import json
import textwrap
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from .. import stats  # noqa: E402
from ..checks import ROUTINGS  # noqa: E402
from ..declarations import FIGURE_KINDS, Catalog, FigureSpec, MetricRow, TableSpec  # noqa: E402
from ..plotting import method_colors, plot_pi_curves  # noqa: E402
from ..store import Results  # noqa: E402
from .model import is_control, method_order  # noqa: E402
from .queries import curve_values, example_values, layer_values, scalar_means  # noqa: E402


@dataclass(frozen=True)
class Figure:
    """A written PNG and its caption (report.md and the HTML report print it under the figure)."""

    path: Path
    caption: str


def n_text(counts) -> str:
    """``n = 20`` or ``n = 18-20`` examples."""
    counts = sorted(set(counts))
    return f"n = {counts[0]}" if len(counts) == 1 else f"n = {counts[0]}-{counts[-1]}"


def _save(fig, path: Path) -> Path:
    fig.savefig(path, dpi=110, metadata={"Software": None})
    plt.close(fig)
    return path


def fit_title(fig, text: str, share: float = 0.95) -> None:
    """The figure's title, wrapped at whole words (or hyphens) until every line fits in ``share`` of the
    figure's width, measured with the renderer: a long model id is never clipped."""
    title = fig.suptitle(text)
    renderer, room, chars = fig.canvas.get_renderer(), share * fig.bbox.width, len(text)
    while title.get_window_extent(renderer).width > room and chars > 10:
        chars = max(10, int(chars * room / title.get_window_extent(renderer).width) - 1)
        title.set_text(textwrap.fill(text, chars))


def curve_band(values: dict[float, dict], resamples: int) -> dict:
    """``{"x", "values", "low", "high"}`` of one mean curve with a 95% bootstrap interval at each x."""
    ests = [stats.estimate({"": examples}, resamples) for examples in values.values()]
    return {"x": list(values), "values": [e.mean for e in ests],
            "low": [e.mean if e.low is None else e.low for e in ests],
            "high": [e.mean if e.high is None else e.high for e in ests]}


def pi_curves(results: Results, model: str, routing: str, out: Path, spec: FigureSpec,
              resamples: int = stats.RESAMPLES) -> list[Figure]:
    """Fig. 3 (Fig. 9 for fixed routing): the curves of ``spec.rows`` (π-Soft-NS and π-Soft-NC) vs π per dataset,
    one line per method (mean curve over examples with its 95% band, legend with the mean of the rows'
    ``_auc`` values), drawn by :func:`llmattr.plotting.plot_pi_curves` with one colour per method across
    datasets, figures and the HTML report."""
    names = [m.metric for m in spec.rows]
    curves = {metric: curve_values(results, model, metric, routing) for metric in names}
    aucs = {metric: scalar_means(results, model, f"{metric}_auc", routing) for metric in names}
    keys = sorted({key for c in curves.values() for key in c})
    colors = method_colors(label for _, label in keys)
    figures = []
    for dataset in sorted({d for d, _ in keys}, key=results.dataset_key):
        per_method = {label: {metric: {**curve_band(curves[metric][(d, label)], resamples),
                                       "auc": aucs[metric][(d, label)]}
                              for metric in names if (d, label) in curves[metric]}
                      for d, label in keys if d == dataset}
        n = n_text(len(next(iter(c[key].values()))) for c in curves.values() for key in c if key[0] == dataset)
        path = out / f"{spec.name}_{dataset}_{routing}.png"
        title = f"{results.dataset_name(dataset)}, model {model}, {routing} routing ({n})"  # a model may be "sst2"
        plot_pi_curves(per_method, path, title=title, colors=colors)
        figures.append(Figure(path, f"{' and '.join(m.title for m in spec.rows)} vs π on "
                                    f"{results.dataset_name(dataset)}, {routing} "
                                    f"routing: mean over {n} examples per method, band = 95% bootstrap "
                                    "interval over examples at each π; legend: mean AUC."))
    return figures


def layer_sweep(results: Results, model: str, out: Path, catalog: Catalog, spec: FigureSpec,
                resamples: int = stats.RESAMPLES) -> list[Figure]:
    """Fig. 5: the rows of ``spec`` (AUCs of π-Soft-NS/NC) vs the number of aggregated layers of a method with a
    layer sweep (Grad-ELLM's ``--layers`` sweep; ``catalog.layer_sweeps`` names each method's swept parameter),
    error bars = 95% bootstrap intervals over examples.

    ``all`` is plotted at the model's number of layers (``n_layers`` in the run settings); a panel per row of
    ``spec``.
    """
    aucs = [(m.metric, m.title) for m in spec.rows]
    n_layers = results.settings(model).get("n_layers")
    sweeps, defaults = catalog.layer_sweeps or {}, catalog.method_defaults or {}
    series: dict = defaultdict(dict)  # (method, other params, metric, dataset) -> {layers: Estimate}
    for metric, _ in aucs:
        for (dataset, method, params), examples in _by_params(results, model, metric).items():
            p, swept = json.loads(params), sweeps.get(method)
            layers = str(p.get(swept, ""))
            k = n_layers if layers == "all" else int(layers) if layers.isdigit() else None
            if swept is None or k is None:
                continue
            rest = results.label(method, {**p, swept: defaults.get(method, {}).get(swept, "all")})
            series[(rest, metric, dataset)][k] = stats.estimate({"": examples}, resamples)
    swept = sorted({rest for (rest, _, _), points in series.items() if len(points) > 1})
    figures = []
    for rest in swept:
        fig, axes = plt.subplots(1, 2, figsize=(10, 4))
        for ax, (metric, title) in zip(axes, aucs, strict=True):
            for (r, m, dataset), points in sorted(series.items(), key=lambda kv: (kv[0][0], kv[0][1],
                                                                                 results.dataset_key(kv[0][2]))):
                if r == rest and m == metric:
                    xs = sorted(points)
                    ests = [points[x] for x in xs]
                    err = [[e.mean - (e.mean if e.low is None else e.low) for e in ests],
                           [(e.mean if e.high is None else e.high) - e.mean for e in ests]]
                    ax.errorbar(xs, [e.mean for e in ests], yerr=err, marker="o", capsize=3,
                                label=results.dataset_name(dataset))
            ax.set(xlabel=spec.xlabel, ylabel=title, title=title)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
        n = n_text(e.n for (r, _, _), points in series.items() if r == rest for e in points.values())
        fig.suptitle(f"{spec.title}: {rest}, {model} ({n})")
        fig.tight_layout()
        path = _save(fig, out / f"{spec.name}_{rest.replace(':', '_')}.png")
        figures.append(Figure(path, f"{spec.caption} of {rest} ({spec.routing} routing): mean over {n} examples, "
                                    "error bars = 95% bootstrap "
                                    "interval over examples."))
    return figures


def _by_params(results: Results, model: str, metric: str) -> dict[tuple, dict[str, float]]:
    """``{(dataset, method, params JSON): {example: value}}`` (like :func:`example_values` but keeping
    raw params)."""
    labels = {}
    for dataset, method, params, *_ in results.values(model, metric, "dynamic"):
        labels[(dataset, results.label(method, params))] = (dataset, method, params)
    values = example_values(results, model, metric, "dynamic")
    return {labels[key]: examples for key, examples in values.items()}


def score_distributions(results: Results, model: str, out: Path) -> list[Figure]:
    """Fig. 6: distribution of the retain probabilities (scores in [0, 1]) per method, datasets pooled."""
    scores: dict = defaultdict(list)
    examples: dict = defaultdict(int)
    for _dataset, method, params, _example, text, _seconds in results.explanations(model):
        steps = json.loads(text)["steps"]
        scores[results.label(method, params)].extend(v for step in steps for v in step["scores"])
        examples[results.label(method, params)] += 1
    if not scores:
        return []
    labels = sorted(scores)
    fig, ax = plt.subplots(figsize=(max(6.0, 1.1 * len(labels)), 4))
    parts = ax.violinplot([scores[label] for label in labels], showmedians=True, widths=0.8)
    colors = method_colors(labels)
    for body, label in zip(parts["bodies"], labels, strict=True):
        body.set_facecolor(colors[label])
        body.set_alpha(0.6)
    ax.set_xticks(range(1, len(labels) + 1), labels, rotation=30, ha="right")
    n = n_text(examples.values())
    ax.set(ylabel="attribution score (retain probability)", ylim=(-0.02, 1.02))
    ax.grid(alpha=0.3, axis="y")
    fit_title(fig, f"Attribution-value distributions, {model} ({n} examples)")
    fig.tight_layout()
    return [Figure(_save(fig, out / "fig6_score_distribution.png"),
                   f"Distribution of the retain probabilities (every content token of every explained step) "
                   f"per method, datasets pooled, {n} examples per method; line = median.")]


def layer_curves(results: Results, model: str, out: Path, tables: Sequence[TableSpec],
                 resamples: int = stats.RESAMPLES, controls: Sequence[str] = ()) -> list[Figure]:
    """Paper 003 Figs. 4-5: the metrics of each ``layers_by_methods`` table vs the layer, a panel per metric, a
    line per method (mean over the datasets of their mean over examples, band = 95% bootstrap interval
    within datasets, as the table's cells); a method without layers (the Random control) is a flat dashed line."""
    figures = []
    for spec in (t for t in tables if t.layout == "layers_by_methods"):
        per_metric = {m.metric: layer_values(results, model, m.metric, spec.routing)[0] for m in spec.rows}
        keys = {key for values in per_metric.values() for key in values}
        if not keys:
            continue
        labels = method_order((label for _, label in keys), controls)
        colors = method_colors(labels)
        fig, axes = plt.subplots(1, len(spec.rows), figsize=(5.5 * len(spec.rows), 4.2), squeeze=False)
        counts = []
        for ax, m in zip(axes[0], spec.rows, strict=True):
            for label in labels:
                layers = sorted(layer for layer, lab in per_metric[m.metric] if lab == label)
                ests = [stats.estimate(per_metric[m.metric][(layer, label)], resamples) for layer in layers]
                counts += [e.n for e in ests]
                dashed = is_control(label, controls)
                style = dict(linestyle="--", marker=None) if dashed else dict(marker="o", markersize=3)
                ax.plot(layers, [e.mean for e in ests], color=colors[label], label=label, **style)
                ax.fill_between(layers, [e.mean if e.low is None else e.low for e in ests],
                                [e.mean if e.high is None else e.high for e in ests], color=colors[label],
                                alpha=0.15, linewidth=0)
            ax.set(xlabel="layer l (output of block l)", ylabel=m.title, title=f"{m.title} {'↑' if m.higher else '↓'}")
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
        datasets = sorted({d for values in per_metric.values() for strata in values.values() for d in strata},
                          key=results.dataset_key)
        n = n_text(counts)
        fig.suptitle(f"{spec.title.split(' (')[0]}, {model} ({n}; {', '.join(map(results.dataset_name, datasets))})")
        fig.tight_layout()
        path = _save(fig, out / f"fig_{spec.name.removeprefix('table_')}.png")
        figures.append(Figure(path, f"{spec.title}: {', '.join(m.title for m in spec.rows)} vs the layer, one line "
                                    f"per method: mean over {n} examples (the mean of the dataset means), band = "
                                    "95% bootstrap interval over examples within datasets; dashed: a method "
                                    "without layers (its one value)."))
    return figures


def plot_curves(panels: Sequence[tuple[MetricRow, dict[str, dict]]], path: Path, title: str, xlabel: str,
                colors: dict[str, str], controls: Sequence[str] = ()) -> Path:
    """A panel per row (two per line), a line per method: ``panels`` holds each row with its ``{label: band}``
    (:func:`curve_band`'s ``x``, ``values``, ``low``, ``high``), the band shaded in the method's colour; a control
    (``controls``) dashed."""
    ncols = min(2, len(panels))
    nrows = -(-len(panels) // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(5.5 * ncols, 4.2 * nrows), squeeze=False)
    for ax, (m, bands) in zip(axes.flat, panels, strict=False):
        for label, band in bands.items():
            ax.plot(band["x"], band["values"], color=colors[label], label=label, marker="o", markersize=3,
                    linestyle="--" if is_control(label, controls) else "-")
            ax.fill_between(band["x"], band["low"], band["high"], color=colors[label], alpha=0.15, linewidth=0)
        ax.set(xlabel=xlabel, ylabel=m.title, title=f"{m.title} {'↑' if m.higher else '↓'}")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    for ax in list(axes.flat)[len(panels):]:
        ax.set_visible(False)
    fit_title(fig, title)
    fig.tight_layout()
    return _save(fig, path)


def metric_curves(results: Results, model: str, out: Path, spec: FigureSpec,
                  resamples: int = stats.RESAMPLES, controls: Sequence[str] = ()) -> list[Figure]:
    """A metric's declared figure (:class:`~llmattr.declarations.FigureSpec`) per dataset: a panel per row, its values
    against the stored x, a line per method (mean over examples, band = 95% bootstrap interval at each x), drawn
    by :func:`plot_curves`."""
    curves = {m.metric: curve_values(results, model, m.metric, spec.routing) for m in spec.rows}
    keys = {key for values in curves.values() for key in values}
    colors = method_colors(label for _, label in keys)
    figures = []
    for dataset in sorted({d for d, _ in keys}, key=results.dataset_key):
        labels = method_order((label for d, label in keys if d == dataset), controls)
        panels = [(m, {label: curve_band(curves[m.metric][(dataset, label)], resamples) for label in labels
                       if (dataset, label) in curves[m.metric]}) for m in spec.rows]
        n = n_text(len(examples) for m in spec.rows for label in labels if (dataset, label) in curves[m.metric]
                   for examples in curves[m.metric][(dataset, label)].values())
        path = plot_curves(panels, out / f"{spec.name}_{dataset}.png",
                           f"{spec.title}, {results.dataset_name(dataset)}, {model} ({n})", spec.xlabel, colors,
                           controls)
        figures.append(Figure(path, f"{spec.caption} {results.dataset_name(dataset)}: mean over {n} examples per "
                                    "method, band = 95% bootstrap interval over examples at each point."))
    return figures


def head_model(results: Results, model: str, catalog: Catalog) -> bool:
    """Whether ``model`` was fine-tuned with a sequence head (``llmattr finetune --head``): its card's task."""
    return (results.settings(model).get("model_card") or {}).get("task") in catalog.head_tasks


def all_figures(results: Results, model: str, out: Path, catalog: Catalog,
                resamples: int = stats.RESAMPLES) -> list[Figure]:
    """Every figure the store has data for; ``catalog`` (the registries' facts) gives the per-layer ones and the
    methods' layer sweeps."""
    kinds = {kind: [s for s in catalog.figures if s.kind == kind] for kind in FIGURE_KINDS}
    if head_model(results, model, catalog):
        kinds["curves"] += kinds["head_curves"]
    figures = [f for spec in kinds["pi_curves"] for routing in ROUTINGS
               for f in pi_curves(results, model, routing, out, spec, resamples)]
    figures += [f for spec in kinds["layer_sweep"] for f in layer_sweep(results, model, out, catalog, spec, resamples)]
    figures += (layer_curves(results, model, out, catalog.tables, resamples, catalog.controls)
                + score_distributions(results, model, out))
    return figures + [f for spec in kinds["curves"]
                      for f in metric_curves(results, model, out, spec, resamples, catalog.controls)]
