"""PNG figures of ``llmattr report`` (paper 000 Figs. 3, 5, 6), written byte-reproducibly.

The Agg backend renders deterministically; PNG metadata carries no software version or date, so an
identical store gives identical files.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from ..explanation import Explanation  # noqa: E402
from ..plotting import method_colors, plot_pi_curves  # noqa: E402
from ..runner import LAYER_SWEEP, method_label  # noqa: E402
from ..store import Results  # noqa: E402
from .tables import curve_means, dataset_key, dataset_name, scalar_means  # noqa: E402

CURVES = (("pi_soft_ns", "π-Soft-NS"), ("pi_soft_nc", "π-Soft-NC"))
AUCS = (("pi_soft_ns_auc", "AUC π-Soft-NS"), ("pi_soft_nc_auc", "AUC π-Soft-NC"))


def _save(fig, path: Path) -> Path:
    fig.savefig(path, dpi=110, metadata={"Software": None})
    plt.close(fig)
    return path


def pi_curves(results: Results, model: str, routing: str, out: Path) -> list[Path]:
    """Fig. 3 (Fig. 9 for fixed routing): π-Soft-NS and π-Soft-NC vs π per dataset, one line per method
    (mean curve over examples, legend with the mean AUC), drawn by :func:`llmattr.plotting.plot_pi_curves`
    with one colour per method across datasets, figures and the HTML report."""
    curves = {metric: curve_means(results, model, metric, routing) for metric, _ in CURVES}
    aucs = {metric: scalar_means(results, model, f"{metric}_auc", routing) for metric, _ in CURVES}
    keys = sorted({key for c in curves.values() for key in c})
    colors = method_colors(label for _, label in keys)
    paths = []
    for dataset in sorted({d for d, _ in keys}, key=dataset_key):
        per_method = {label: {metric: {"pi": list(curves[metric][(d, label)]),
                                       "values": list(curves[metric][(d, label)].values()),
                                       "auc": aucs[metric][(d, label)]}
                              for metric, _ in CURVES if (d, label) in curves[metric]}
                      for d, label in keys if d == dataset}
        path = out / f"fig3_pi_curves_{dataset}_{routing}.png"
        paths.append(plot_pi_curves(per_method, path, title=f"{dataset_name(dataset)}, {model}, {routing} routing",
                                    colors=colors))
    return paths


def layer_sweep(results: Results, model: str, out: Path) -> list[Path]:
    """Fig. 5: AUC of π-Soft-NS/NC vs number of aggregated layers of Grad-ELLM (a ``--layers`` sweep).

    ``all`` is plotted at the model's number of layers (``n_layers`` in the run settings).
    """
    n_layers = results.settings(model).get("n_layers")
    series: dict = defaultdict(dict)  # (method, other params, metric, dataset) -> {layers: auc}
    for metric, _ in AUCS:
        for (dataset, method, params), value in _by_params(results, model, metric).items():
            p = json.loads(params)
            layers = str(p.get("layers", ""))
            k = n_layers if layers == "all" else int(layers) if layers.isdigit() else None
            if method not in LAYER_SWEEP or k is None:
                continue
            rest = method_label(method, {**p, "layers": "all"})
            series[(rest, metric, dataset)][k] = value
    swept = sorted({rest for (rest, _, _), points in series.items() if len(points) > 1})
    paths = []
    for rest in swept:
        fig, axes = plt.subplots(1, 2, figsize=(10, 4))
        for ax, (metric, title) in zip(axes, AUCS, strict=True):
            for (r, m, dataset), points in sorted(series.items(), key=lambda kv: (kv[0][0], kv[0][1],
                                                                                 dataset_key(kv[0][2]))):
                if r == rest and m == metric:
                    xs = sorted(points)
                    ax.plot(xs, [points[x] for x in xs], marker="o", label=dataset_name(dataset))
            ax.set(xlabel="number of aggregated layers", ylabel=title, title=title)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
        fig.suptitle(f"Layer aggregation: {rest}, {model}")
        fig.tight_layout()
        paths.append(_save(fig, out / f"fig5_layers_{rest.replace(':', '_')}.png"))
    return paths


def _by_params(results: Results, model: str, metric: str) -> dict[tuple, float]:
    """``{(dataset, method, params JSON): mean}`` (like :func:`scalar_means` but keeping raw params)."""
    labels = {}
    for dataset, method, params, *_ in results.values(model, metric, "dynamic"):
        labels[(dataset, method_label(method, params))] = (dataset, method, params)
    means = scalar_means(results, model, metric, "dynamic")
    return {labels[key]: value for key, value in means.items()}


def score_distributions(results: Results, model: str, out: Path) -> list[Path]:
    """Fig. 6: distribution of the retain probabilities (scores in [0, 1]) per method, datasets pooled."""
    scores: dict = defaultdict(list)
    for _dataset, method, params, _example, text, _seconds in results.explanations(model):
        expl = Explanation.from_json(text)
        scores[method_label(method, params)].extend(v for step in expl.steps for v in step.scores)
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
    ax.set(ylabel="attribution score (retain probability)", ylim=(-0.02, 1.02),
           title=f"Attribution-value distributions, {model}")
    ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    return [_save(fig, out / "fig6_score_distribution.png")]


def all_figures(results: Results, model: str, out: Path) -> list[Path]:
    paths = []
    for routing in ("dynamic", "fixed"):
        paths += pi_curves(results, model, routing, out)
    return paths + layer_sweep(results, model, out) + score_distributions(results, model, out)
