"""Plots: pi-Soft-NS and pi-Soft-NC against the retaining probability pi (paper 000 Fig. 3).

matplotlib runs on the Agg backend (no display needed); figures are written to a file.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

PANELS = (("pi_soft_ns", "pi-Soft-NS"), ("pi_soft_nc", "pi-Soft-NC"))


def method_colors(labels) -> dict[str, str]:
    """One colour per label (hex), assigned in sorted order from matplotlib's tab10 (tab20 past ten), so
    every figure and the HTML report give a method the same colour."""
    from matplotlib import colormaps
    from matplotlib.colors import to_hex

    labels = sorted(set(labels))
    cmap = colormaps["tab10" if len(labels) <= 10 else "tab20"]
    return {label: to_hex(cmap(i % cmap.N)) for i, label in enumerate(labels)}


def plot_pi_curves(results: Mapping[str, dict], path: str | Path, title: str | None = None,
                   colors: Mapping[str, str] | None = None) -> Path:
    """Draw pi-Soft-NS and pi-Soft-NC vs pi, one line per entry of ``results``, and save to ``path``.

    ``results`` maps a label (a method name, say) to a ``SoftResult.to_dict()`` or to its ``"metrics"``
    part: ``{"pi_soft_ns": {"pi": [...], "values": [...], "auc": x}, "pi_soft_nc": {...}}``. The legend
    shows each curve's AUC. A metric that was not computed (None) is skipped. ``colors`` maps labels to
    colours (default :func:`method_colors` of the labels). A curve with ``"low"`` and ``"high"`` lists
    (a confidence interval per pi) is drawn with a shaded band between them.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = colors or method_colors(results)
    fig, axes = plt.subplots(1, 2, figsize=(10, 4), constrained_layout=True)
    for ax, (key, name) in zip(axes, PANELS, strict=True):
        for label, result in results.items():
            curve = result.get("metrics", result).get(key)
            if curve:
                ax.plot(curve["pi"], curve["values"], marker="o", markersize=3, color=colors[label],
                        label=f"{label} (AUC {curve['auc']:.3f})")
                if "low" in curve:
                    ax.fill_between(curve["pi"], curve["low"], curve["high"], color=colors[label], alpha=0.15,
                                    linewidth=0)
        ax.set_xlabel("retaining probability pi")
        ax.set_ylabel(name)
        ax.set_title(f"{name} vs pi")
        ax.grid(alpha=0.3)
        if ax.has_data():
            ax.legend(fontsize=8)
    if title:
        fig.suptitle(title)
    path = Path(path)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
