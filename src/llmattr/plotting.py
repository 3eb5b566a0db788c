"""Plots: pi-Soft-NS and pi-Soft-NC against the retaining probability pi (paper 000 Fig. 3), and the
source x target attribution matrix of one Explanation (:func:`plot_matrix`).

matplotlib runs on the Agg backend (no display needed); figures are written to a file.
"""

from __future__ import annotations

import textwrap
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from .render import colour_scale, ink, number, shade

PANELS = (("pi_soft_ns", "pi-Soft-NS"), ("pi_soft_nc", "pi-Soft-NC"))


def method_colors(labels) -> dict[str, str]:
    """One colour per label (hex), assigned in sorted order from matplotlib's tab10 (tab20 past ten), so
    every figure and the HTML report give a method the same colour."""
    from matplotlib import colormaps
    from matplotlib.colors import to_hex

    labels = sorted(set(labels))
    cmap = colormaps["tab10" if len(labels) <= 10 else "tab20"]
    return {label: to_hex(cmap(i % cmap.N)) for i, label in enumerate(labels)}


def curve_x(curve: Mapping) -> list:
    """A curve's x values (the pi grid of a pi-Soft curve): ``"x"``, or ``"pi"``, their key in the results of
    llmattr before issue 39 (an ``--eval-json`` file written then still plots)."""
    return curve["x"] if "x" in curve else curve["pi"]


def plot_pi_curves(results: Mapping[str, dict], path: str | Path, title: str | None = None,
                   colors: Mapping[str, str] | None = None) -> Path:
    """Draw pi-Soft-NS and pi-Soft-NC vs pi, one line per entry of ``results``, and save to ``path``.

    ``results`` maps a label (a method name, say) to a ``SoftResult.to_dict()`` or to its ``"metrics"``
    part: ``{"pi_soft_ns": {"x": [pi ...], "values": [...], "auc": a}, "pi_soft_nc": {...}}`` (a result written
    before the curves' x was named ``x`` holds it under ``"pi"``: :func:`curve_x`). The legend
    shows each curve's AUC. A metric that was not computed (None) is skipped. ``colors`` maps labels to
    colours (default :func:`method_colors` of the labels). A curve with ``"low"`` and ``"high"`` lists
    (a confidence interval at each pi) is drawn with a shaded band between them.
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
                ax.plot(curve_x(curve), curve["values"], marker="o", markersize=3, color=colors[label],
                        label=f"{label} (AUC {curve['auc']:.3f})")
                if "low" in curve:
                    ax.fill_between(curve_x(curve), curve["low"], curve["high"], color=colors[label], alpha=0.15,
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


# Fonts tried after DejaVu Sans for characters it lacks (CJK, emoji, more Arabic); those installed are used.
FALLBACK_FONTS = ("Noto Sans CJK JP", "Noto Sans CJK SC", "Noto Sans Arabic", "Noto Color Emoji", "Noto Emoji")


def _font_families() -> list[str]:
    from matplotlib import font_manager

    installed = {font.name for font in font_manager.fontManager.ttflist}
    return ["DejaVu Sans", *(name for name in FALLBACK_FONTS if name in installed)]


def _colormap(diverging: bool):
    """The colours of :func:`llmattr.render.shade` as a matplotlib colormap (HTML and figure agree)."""
    from matplotlib.colors import LinearSegmentedColormap

    stops = (-1.0, 0.0, 1.0) if diverging else (0.0, 1.0)
    return LinearSegmentedColormap.from_list("llmattr", [tuple(c / 255 for c in shade(u)) for u in stops])


def plot_matrix(expl, path: str | Path, numbers: bool = False, shared_scale: bool = False,
                title: str | None = None) -> Path:
    """The source x target attribution matrix (as Inseq draws it) saved as PNG, SVG or PDF by ``path``'s suffix.

    Rows: the tokens the explanation holds scores for (its content span, shown by their own characters of
    the text); columns: the generated tokens, one per step. Colours follow
    :func:`llmattr.render.colour_scale` (diverging raw scores for signed methods, per step or, with
    ``shared_scale``, over all steps) with a colour bar; when each step has its own scale (a signed method,
    several steps) the bar reads ``-max .. +max`` and each step's ``±max`` is written under its column
    (:func:`step_peaks`); ``numbers`` writes each value in its cell. A last
    row shows each step's probability of its token when the explanation records it (``Step.prob``).
    SVG keeps text as text, so every character (Arabic, CJK, emoji) is in the file exactly; PNG and PDF
    draw it with DejaVu Sans and, for scripts it lacks, the installed fonts of :data:`FALLBACK_FONTS`.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    scale = colour_scale(expl, shared_scale)
    unit, values = scale.unit.T, scale.values.T  # (source tokens, steps)
    sources = [token.replace("\n", "\u21b5") for token in expl.span_display]
    targets = [step.token.replace("\n", "\u21b5") for step in expl.steps]
    probs = [step.prob for step in expl.steps]
    has_probs = all(p is not None for p in probs)
    n_src, n_tgt = unit.shape
    rc = {"font.family": _font_families(), "svg.fonttype": "none", "pdf.fonttype": 42}
    with matplotlib.rc_context(rc):
        width, height = max(5.0, 2.5 + 0.55 * n_tgt), 1.8 + 0.32 * (n_src + (1.5 if has_probs else 0))
        fig = plt.figure(figsize=(width, height), constrained_layout=True)
        rows = (n_src, 1) if has_probs else (n_src,)
        grid = fig.add_gridspec(len(rows), 2, height_ratios=rows, width_ratios=(n_tgt, 0.4))
        ax = fig.add_subplot(grid[0, 0])
        lo = -1.0 if scale.diverging else 0.0
        image = ax.imshow(unit, cmap=_colormap(scale.diverging), vmin=lo, vmax=1.0, aspect="auto",
                          interpolation="nearest")
        ax.set_yticks(range(n_src), sources)
        ax.set_xticks(range(n_tgt), targets, rotation=60, ha="left")
        ax.xaxis.tick_top()
        ax.set_ylabel("source tokens")
        ax.set_title(title or f"{expl.method} ({expl.model})", pad=12)
        if numbers:
            for (i, j), u in np.ndenumerate(unit):
                ax.text(j, i, number(values[i, j]), ha="center", va="center", fontsize=7, color=ink(u))
        if scale.row_peaks is not None:
            step_peaks(ax, scale)
        bar = fig.colorbar(image, cax=fig.add_subplot(grid[0, 1]))
        bar.set_label(textwrap.fill(scale.label, 40), fontsize=8)  # a short figure's height holds 40 characters
        if scale.diverging:  # the values at the ends, or -max/+max when each step has its own max |raw|
            bar.set_ticks([-1.0, 0.0, 1.0], labels=[scale.ends[0], "0", scale.ends[1]])
        elif shared_scale:
            bar.set_ticks([0.0, 1.0], labels=[number(scale.lo), number(scale.hi)])
        if has_probs:
            pax = fig.add_subplot(grid[1, 0], sharex=ax)
            pax.imshow(np.array([probs]), cmap="Greens", vmin=0.0, vmax=1.0, aspect="auto")
            for j, p in enumerate(probs):
                pax.text(j, 0, f"{p:.2f}", ha="center", va="center", fontsize=7, color=ink(p))
            pax.set_yticks([0], ["probability"])
            pax.tick_params(axis="x", bottom=False, labelbottom=False, top=False, labeltop=False)
        path = Path(path)
        fig.savefig(path, dpi=150)
        plt.close(fig)
    return path


def step_peaks(ax, scale) -> None:
    """Each step's ``±max |raw|`` (``scale.row_peaks``) under its column of the matrix ``ax``: the numbers that the
    colour bar's ``-max``/``+max`` stand for in that column."""
    peaks = ax.secondary_xaxis("bottom")
    peaks.set_xticks(range(len(scale.row_peaks)), [scale.row_end(j) for j in range(len(scale.row_peaks))],
                     rotation=45, ha="right", rotation_mode="anchor", fontsize=7)
    peaks.set_xlabel("each step's max |raw| (the bar's \u00b1max)", fontsize=8)
