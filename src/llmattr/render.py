"""Show explanations: a coloured token heatmap in the terminal (rich), inline/self-contained HTML, and a
grid of several explanations of one text (methods side by side) with their tokens aligned in columns.

Colour scales (shared with the matrix figure of :mod:`llmattr.plotting`, :func:`colour_scale`):

- signed methods: a diverging scale of the raw scores, blue (negative) - white (0) - red (positive),
  symmetric about 0 (``|raw| / max |raw|``), so a strongly negative token is as visible as a positive one;
  each step has its own ``max |raw|`` (shown on its row when the steps differ) unless ``shared_scale``;
- unsigned methods: white (0) to red (1) of the score in [0, 1] (each step min-max'd, the retain
  probabilities the metrics use) or, with ``shared_scale``, of the raw scores over all steps at once.

The colour bar's labels are the values at its ends in the scale the cells use, and each heatmap carries
its own bar (an inline style), so several heatmaps on one page never share one.

Tokens show their own characters of the text (``display_tokens``), so Arabic, CJK, emoji and combining
accents are printed exactly; in HTML the tokens are plain inline spans (no padding or margin), so letters
of a script that joins (Arabic) still join across tokens, and the grid's cells (a column per token) carry
zero-width joiners where a word goes on (:func:`llmattr.display.joined_cells`). Where colour is not visible
(no colour, or output piped into a file or a CI log) the terminal view prints each token's value after it;
``numbers=True`` forces it.

The terminal's colour depth is rich's detection from ``TERM``/``COLORTERM`` (``COLORTERM=truecolor`` asks for
24-bit colour); a 16-colour terminal gets :data:`SIXTEEN`, an explicit ramp of its own blues and reds (rich's
nearest-colour downgrade of the RGB ramp would turn the pale blues grey). Spinners and progress bars are drawn on
stderr, and redrawn only where stderr is a terminal (:func:`progress_console`).

This module reads explanations by their attributes (:class:`Shown`) and imports nothing of
:mod:`llmattr.explanation`, which imports it for its notebook views: the views go one way.
"""

from __future__ import annotations

import html
import importlib.util
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
from rich.console import Console
from rich.table import Table
from rich.text import Text

from .display import continues_word, joined_cells

WHITE = np.array([255.0, 255.0, 255.0])
RED = np.array([214.0, 39.0, 40.0])  # matplotlib's tab:red
BLUE = np.array([31.0, 119.0, 180.0])  # matplotlib's tab:blue


class Shown(Protocol):
    """What a view reads of an explanation (:class:`llmattr.explanation.Explanation` has it all)."""

    model: str
    method: str
    params: dict
    signed: bool
    steps: list
    task: str | None
    generated: str
    forced: bool
    warnings: list[str]
    text: str

    sources: object | None  # llmattr.sources.Sources, or None

    @property
    def span_display(self) -> list[str]: ...

    def to_numpy(self, raw: bool = False) -> np.ndarray: ...

    def source_scores(self, raw: bool = True) -> np.ndarray: ...

    def source_texts(self) -> list[str]: ...


@dataclass
class Scale:
    """How an Explanation's values become colours.

    ``values`` ``(steps, tokens)`` are the numbers shown, ``unit`` the same mapped to [-1, 1] (diverging)
    or [0, 1] (sequential), ``lo``/``hi`` the values at the ends of the colour bar. ``row_peaks``: when the
    rows of a diverging scale have their own ``max |raw|`` (several steps, no shared scale), the value at
    the ends of each row (then the bar reads ``-max .. +max`` and each row shows its ``max``).
    """

    values: np.ndarray
    unit: np.ndarray
    diverging: bool
    lo: float
    hi: float
    label: str
    row_peaks: np.ndarray | None = None

    @property
    def ends(self) -> tuple[str, str]:
        """The labels of the bar's two ends: values, or ``-max``/``+max`` when each row has its own."""
        return ("-max", "+max") if self.row_peaks is not None else (number(self.lo), number(self.hi))

    def row_end(self, i: int) -> str:
        """Row ``i``'s value at the ends of the bar (``±max``), or "" when the bar's labels hold for it."""
        return "" if self.row_peaks is None else f"\u00b1{number(float(self.row_peaks[i]))}"


def colour_scale(expl: Shown, shared_scale: bool = False) -> Scale:
    """The colour scale of ``expl`` (module docstring); ``shared_scale`` uses one scale for every step."""
    if expl.signed:
        raw = expl.to_numpy(raw=True)
        peak = np.abs(raw).max(axis=None if shared_scale else 1, keepdims=True, initial=0.0)
        unit = np.divide(raw, peak, out=np.zeros_like(raw), where=peak > 0)
        top = float(np.abs(raw).max(initial=0.0))
        if shared_scale or raw.shape[0] <= 1:
            what = "one scale for all steps" if raw.shape[0] > 1 else "max |raw| at the ends"
            return Scale(raw, unit, True, -top, top, f"raw score (signed; {what})")
        return Scale(raw, unit, True, -top, top, "raw score (signed; each step scaled by its own max |raw|, "
                     "shown with the step)", row_peaks=peak[:, 0])
    if not shared_scale:
        scores = expl.to_numpy()
        return Scale(scores, scores, False, 0.0, 1.0, "score (each step min-max'd to [0, 1])")
    raw = expl.to_numpy(raw=True)
    lo, hi = float(raw.min(initial=0.0)), float(raw.max(initial=0.0))
    unit = (raw - lo) / (hi - lo) if hi > lo else np.zeros_like(raw)
    return Scale(raw, unit, False, lo, hi, "raw score (one scale for all steps)")


def shade(u: float) -> tuple[int, int, int]:
    """White at 0 to red at +1 and blue at -1 (linear in RGB)."""
    end = RED if u >= 0 else BLUE
    rgb = WHITE + (end - WHITE) * min(abs(float(u)), 1.0)
    return tuple(int(round(c)) for c in rgb)


def rgb(u: float) -> str:
    """:func:`shade` as a CSS and rich colour, ``rgb(r,g,b)`` (rich refuses spaces in a colour)."""
    return "rgb({},{},{})".format(*shade(u))


def ink(u: float) -> str:
    """Text colour readable on :func:`shade` ``(u)``."""
    return "white" if abs(u) > 0.65 else "black"


def number(value: float) -> str:
    """A value in at most 8 characters: two decimals between 0.01 and 100, else one significant digit and an
    exponent; zero (a -0.0 included) is 0.00."""
    if value == 0:
        return "0.00"
    return f"{value:.2f}" if 0.01 <= abs(value) < 100 else f"{value:.1e}"


# ANSI "white" is light grey in most terminal themes: on a deep colour the terminal writes bright white
TERMINAL_INK = {"white": "bright_white", "black": "black"}


# A 16-colour terminal's ramp, from -1 to +1: (upper end of the bin, style); its own blues and reds, white at 0.
SIXTEEN = ((-0.55, "bright_white on blue"), (-0.15, "black on bright_blue"), (0.15, "black on bright_white"),
           (0.55, "black on bright_red"), (1.0, "bright_white on red"))
FEW_COLOURS = ("standard", "windows")  # rich's names of the 16- and 8-colour systems


def terminal_style(u: float, colours: str | None) -> str:
    """The rich style of a token whose scale value is ``u``: the RGB ramp of :func:`shade` (rich renders it in
    24 or 256 colours), or :data:`SIXTEEN` where the terminal has 16 (``colours``: rich's colour system)."""
    if colours in FEW_COLOURS:
        return next(style for end, style in SIXTEEN if u <= end)
    return f"{TERMINAL_INK[ink(u)]} on {rgb(u)}"


def _visible(token: str) -> str:
    return token.replace("\n", "\u21b5")


def spaced(token: str, following: str) -> bool:
    """Whether whitespace already stands between ``token`` and ``following`` (a line may break there)."""
    return token[-1:].isspace() or following[:1].isspace()


def heatmap_text(tokens: list[str], unit, values=None, colours: str | None = "truecolor") -> Text:
    """One row of tokens on their colours (``colours``: rich's colour system of the console); with ``values``,
    each token followed by its value, and a space where the next token starts a new word or sign without one of
    its own (where a line may break, never inside a number; a sub-word token goes on without one)."""
    text = Text()
    for i, (token, u) in enumerate(zip(tokens, unit, strict=True)):
        text.append(_visible(token), style=terminal_style(u, colours))
        if values is not None:
            text.append(f"[{number(values[i])}]", style="dim")
            if i + 1 < len(tokens) and not spaced(token, tokens[i + 1]) and not continues_word(token, tokens[i + 1]):
                text.append(" ")
    return text


def colour_hidden(console: Console) -> bool:
    """Whether ``console`` shows no colour: no colour system (not a terminal), ``NO_COLOR``, or a file or pipe
    that colour was forced into (``FORCE_COLOR``): there the heatmap prints its numbers by default."""
    isatty = getattr(console.file, "isatty", None)
    return console.color_system is None or console.no_color or not (isatty is not None and isatty())


def progress_console() -> Console:
    """The console of spinners and progress bars: stderr, so stdout holds only the results. Only where stderr is
    a terminal is a bar redrawn in place; written to a file or a pipe (even with ``FORCE_COLOR``) a bar is drawn
    once, when it ends, and a spinner not at all. In a Jupyter kernel the bar is a widget; without ipywidgets
    (which rich's live display needs, and warns about) it is plain text in the cell, drawn when it ends."""
    console = Console(stderr=True, force_terminal=None if sys.stderr.isatty() else False)
    if console.is_jupyter and importlib.util.find_spec("ipywidgets") is None:
        return Console(force_jupyter=False)
    return console


def print_explanation(expl: Shown, console: Console | None = None, max_steps: int = 20,
                      numbers: bool | None = None, shared_scale: bool = False) -> None:
    """The answer, then one heatmap row per generated token over the content span.

    ``numbers`` (default: where colour is not seen, :func:`colour_hidden`) prints each value. The header lines
    (answer, scale) are never wrapped: a long answer stays on one line at any width.
    """
    console = console or Console()
    numbers = colour_hidden(console) if numbers is None else numbers
    scale = colour_scale(expl, shared_scale)
    console.print(f"[bold]model[/] {expl.model}  [bold]method[/] {expl.method}  [bold]answer[/] "
                  f"{expl.generated!r}" + ("  (forced)" if expl.forced else ""), highlight=False, soft_wrap=True)
    lo, hi = scale.ends
    ends = f"blue {lo} < 0 < red {hi}" if scale.diverging else f"white {lo} .. red {hi}"
    console.print(f"[bold]scale[/] {scale.label}, {ends}", highlight=False, soft_wrap=True)
    table = Table(show_header=True, header_style="bold", box=None, pad_edge=False)
    table.add_column("step")
    table.add_column("token")
    if scale.row_peaks is not None:
        table.add_column("max", no_wrap=True)
    table.add_column("content span", overflow="fold")
    tokens = expl.span_display
    for i, step in enumerate(expl.steps[:max_steps]):
        peak = (scale.row_end(i),) if scale.row_peaks is not None else ()
        table.add_row(str(i), repr(step.token), *peak, heatmap_text(
            tokens, scale.unit[i], scale.values[i] if numbers else None, console.color_system))
    console.print(table)
    if len(expl.steps) > max_steps:
        console.print(f"... {len(expl.steps) - max_steps} more steps (see --html / --json)")
    if getattr(expl, "sources", None) is not None:
        console.print(source_table(expl, console.color_system, console.width))
    for warning in expl.warnings:
        console.print(f"[yellow]warning:[/] {warning}")


SOURCE_STEPS = 4  # steps the HTML views show beside the whole answer's total (the terminal: as many as fit)
BAR_WIDTH = 12  # characters of a full bar in the terminal's source table
EXCERPT = 60  # characters of a source's text shown beside its bar
TEXT_MIN = 12  # the fewest characters of a source's text the terminal keeps before it drops step columns


@dataclass
class SourceView:
    """What the views show of an explanation's sources: names, text excerpts, and one column per shown quantity:
    the whole answer's total (the sum over every step, first, where the answer has several steps) then each of the
    first steps (``values`` ``(sources, columns)``: :meth:`Explanation.source_scores`, the sum of each source's
    tokens' raw scores), the same over each column's largest ``|value|`` (``unit``, in [-1, 1]) and the columns'
    names (``columns``)."""

    names: list[str]
    excerpts: list[str]
    values: np.ndarray
    unit: np.ndarray
    columns: list[str]


def source_view(expl: Shown, max_steps: int = SOURCE_STEPS) -> SourceView:
    """The sources of ``expl`` as the views show them (:class:`SourceView`): the total over the answer, then the
    first ``max_steps`` steps (a one-step answer: its step alone, which is its total)."""
    every = np.asarray(expl.source_scores(raw=True), dtype=np.float64).T  # (sources, steps)
    steps = [f"step {step.token!r}" for step in expl.steps]
    if every.shape[1] > 1:
        values = np.concatenate([every.sum(axis=1, keepdims=True), every[:, :max_steps]], axis=1)
        columns = [f"total ({len(steps)} steps)", *steps[:max_steps]]
    else:
        values, columns = every, steps
    peak = np.abs(values).max(axis=0, keepdims=True, initial=0.0)
    unit = np.divide(values, peak, out=np.zeros_like(values), where=peak > 0)
    excerpts = [" ".join(text.split()) for text in expl.source_texts()]
    excerpts = [t if len(t) <= EXCERPT else t[: EXCERPT - 1] + "\u2026" for t in excerpts]
    return SourceView(list(expl.sources.names), excerpts, values, unit, columns)


def bar_text(u: float, value: float, colours: str | None) -> Text:
    """A terminal bar of ``|u|`` x :data:`BAR_WIDTH` blocks, red for a positive value and blue for a negative
    one, then the value."""
    blocks = int(round(abs(float(u)) * BAR_WIDTH))
    colour = ("red" if u >= 0 else "blue") if colours in FEW_COLOURS else rgb(1.0 if u >= 0 else -1.0)
    text = Text()
    text.append("\u2588" * blocks, style=colour)
    text.append(" " * (BAR_WIDTH - blocks) + f" {number(value)}")
    return text


def source_table(expl: Shown, colours: str | None = "truecolor", width: int = 80) -> Table:
    """The terminal's source table at ``width`` columns: each source's whole name, its text (cut to what is left),
    and a bar with its value for the whole answer's total and for as many first steps as fit (the sum of each
    source's tokens' raw scores; the bar's length is the value over the column's largest ``|value|``). Names,
    values and the total are never cut: step columns go first, then the text narrows."""
    view = source_view(expl, max_steps=len(expl.steps))
    name_width = max(len("source"), *map(len, view.names))
    cell = BAR_WIDTH + 1 + max(len(number(v)) for v in view.values.flat)
    text_width = min(TEXT_MIN, max(map(len, view.excerpts)))
    fits = max(1, (width - name_width - text_width - 2) // (cell + 2))  # the total (or the one step) always
    table = Table(title="sources (token scores summed; signed methods keep the sign)",
                  title_justify="left", box=None, pad_edge=False, header_style="bold")
    table.add_column("source", no_wrap=True, min_width=name_width)
    shown = view.columns[:fits]
    left = width - name_width - len(shown) * (cell + 2) - 2  # two spaces between columns (rich's padding)
    table.add_column("text", no_wrap=True, overflow="ellipsis", max_width=max(1, min(EXCERPT, left)))
    for column in shown:
        table.add_column(column, no_wrap=True, overflow="ellipsis", width=cell)
    for i, name in enumerate(view.names):
        table.add_row(name, view.excerpts[i], *(bar_text(view.unit[i, j], view.values[i, j], colours)
                                                 for j in range(len(shown))))
    if len(shown) < len(view.columns):
        more = len(view.columns) - len(shown)
        table.caption = f"{more} more step{'s' * (more > 1)}: --html or --json show them"
        table.caption_justify = "left"
    return table


def bar_cell(u: float, value: float) -> str:
    """A table cell with a bar of ``|u|`` x its width (red for a positive value, blue for a negative one) and the
    value."""
    return (f'<td class="sbar"><span class="fill" style="width:{abs(u) * 70:.1f}%;background:'
            f'{rgb(1.0 if u >= 0 else -1.0)}"></span><span class="num">{html.escape(number(value))}</span></td>')


def source_html(expl: Shown) -> str:
    """The source table as HTML: each source's name and text (full text on hover) and a bar per step."""
    view = source_view(expl)
    texts = expl.source_texts()
    head = "".join(f"<th>{html.escape(column)}</th>" for column in view.columns)
    rows = []
    for i, name in enumerate(view.names):
        bars = "".join(bar_cell(u, v) for u, v in zip(view.unit[i], view.values[i], strict=True))
        rows.append(f'<tr><td><b>{html.escape(name)}</b></td><td class="src" title="{html.escape(texts[i])}">'
                    f"{html.escape(view.excerpts[i])}</td>{bars}</tr>")
    return ('<div class="sources"><p class="meta">sources: the sum of each source\'s token scores (signed methods '
            'keep the sign: red raises the output, blue lowers it)</p><table><tr><th>source</th><th>text</th>'
            f"{head}</tr>" + "\n".join(rows) + "</table></div>")


# One style for every heatmap: nothing in it depends on an explanation (the bar's gradient is inline).
STYLE = """<style>
.llmattr{font-family:system-ui,sans-serif;color:#222}
.llmattr table{border-collapse:collapse}
.llmattr td,.llmattr th{padding:4px 8px;vertical-align:top;border-bottom:1px solid #eee;text-align:left}
.llmattr .tok{white-space:pre-wrap;cursor:default;line-height:1.7;box-decoration-break:clone;
 -webkit-box-decoration-break:clone}
.llmattr .tok.n{display:inline-block;text-align:center;margin:0 1px}
.llmattr .num{display:block;font-size:70%;opacity:.8;text-align:center;direction:ltr;unicode-bidi:isolate}
.llmattr .meta{color:#555;font-size:90%}
.llmattr .bar{display:inline-block;width:220px;height:12px;vertical-align:middle;border:1px solid #ccc}
.llmattr .grid td.c{text-align:center;padding:2px 3px;white-space:pre}
.llmattr .grid th.c{font-weight:normal;padding:2px 3px;white-space:pre;text-align:center;background:#f6f6f6}
.llmattr .side{display:flex;flex-wrap:wrap;gap:24px;align-items:flex-start}
.llmattr .side>*{flex:1 1 420px;min-width:0}
.llmattr .side>.sources{flex:1 1 560px}
.llmattr .sbar{min-width:110px;white-space:nowrap}
.llmattr .sbar .fill{display:inline-block;height:12px;vertical-align:middle;margin-right:6px}
.llmattr .sbar .num{display:inline;font-size:80%}
.llmattr .src{min-width:160px;max-width:360px;font-size:90%}
.llmattr .sources,.llmattr .wide{max-width:100%;overflow-x:auto}
</style>"""


def colour_bar(scale: Scale) -> str:
    """The colour bar of ``scale``: its end labels, a gradient in the element's own style, its label."""
    return bar_html(scale.diverging, *scale.ends, scale.label)


def bar_html(diverging: bool, lo: str, hi: str, label: str) -> str:
    """A colour bar from ``lo`` to ``hi`` (diverging: blue - white - red, else white - red)."""
    stops = [-1.0, 0.0, 1.0] if diverging else [0.0, 1.0]
    gradient = ",".join(rgb(u) for u in stops)
    return (f'<p class="meta"><span class="lo">{html.escape(lo)}</span> '
            f'<span class="bar" style="background:linear-gradient(to right,{gradient})"></span> '
            f'<span class="hi">{html.escape(hi)}</span> &nbsp; {html.escape(label)}</p>')


def _cell(token: str, u: float, value: float, score: float, raw: float, numbers: bool) -> str:
    number_html = f'<span class="num">{html.escape(number(value))}</span>' if numbers else ""
    return (f'<span class="tok{" n" if numbers else ""}" style="background:{rgb(u)};color:{ink(u)}" '
            f'title="score {score:.4f} | raw {raw:.4g}">{html.escape(_visible(token))}{number_html}</span>')


def heatmap_html(expl: Shown, numbers: bool = False, shared_scale: bool = False) -> str:
    """The heatmap as an HTML fragment (a notebook's ``_repr_html_``): one row per generated token,
    hover shows each token's score and raw value; ``numbers`` writes them in the cells."""
    scale = colour_scale(expl, shared_scale)
    tokens = expl.span_display
    rows = []
    for i, step in enumerate(expl.steps):
        cells = "".join(_cell(tok, u, v, score, raw, numbers) for tok, u, v, score, raw in
                        zip(tokens, scale.unit[i], scale.values[i], step.scores, step.raw, strict=True))
        peak = f"<td>{html.escape(scale.row_end(i))}</td>" if scale.row_peaks is not None else ""
        rows.append(f"<tr><td>{i}</td><td><code>{html.escape(repr(step.token))}</code></td>{peak}"
                    f"<td dir='auto'>{cells}</td></tr>")
    warnings = "".join(f'<p class="meta">warning: {html.escape(w)}</p>' for w in expl.warnings)
    peak_head = "<th>max</th>" if scale.row_peaks is not None else ""
    return (
        f'{STYLE}<div class="llmattr">{colour_bar(scale)}'
        f'<p class="meta">model <b>{html.escape(expl.model)}</b> &middot; method <b>{html.escape(expl.method)}</b>'
        f' &middot; params {html.escape(str(expl.params))} &middot; answer <b>{html.escape(repr(expl.generated))}</b>'
        f'{" (forced)" if expl.forced else ""}</p>'
        + beside(f'<table><tr><th>step</th><th>token</th>{peak_head}<th>content span</th></tr>' + "\n".join(rows)
                 + "</table>", expl) + f"{warnings}</div>"
    )


def beside(heatmap: str, expl: Shown) -> str:
    """The heatmap, with the source table beside it where the explanation has sources."""
    if getattr(expl, "sources", None) is None:
        return heatmap
    return f'<div class="side"><div>{heatmap}</div>{source_html(expl)}</div>'


def grid_html(explanations: Sequence[Shown], numbers: bool = False, shared_scale: bool = False) -> str:
    """Several explanations as one grid per text: a column per content token (aligned across methods),
    a row per (explanation, step), each row coloured on its own explanation's scale.

    Explanations of the same text and content tokens (methods side by side, one generation) share a
    grid; each row names its method and model and the value at the ends of its bar. A grid wider than the page
    scrolls inside its own box, the page keeps its width.
    """
    groups: dict[tuple, list[Shown]] = {}
    for expl in explanations:
        groups.setdefault((expl.text, tuple(expl.span_display)), []).append(expl)
    kinds = {expl.signed for expl in explanations}
    bars = "".join(bar_html(True, "-max", "+max", "signed methods: raw score, each row scaled to the max |raw| "
                            "in its scale column") if signed else
                   bar_html(False, "min", "max", "unsigned methods: each row from the low to the high end of its "
                            "scale column")
                   for signed in sorted(kinds, reverse=True))
    tables = []
    for (_, tokens), members in groups.items():
        head = "".join(f'<th class="c">{html.escape(_visible(t))}</th>' for t in joined_cells(list(tokens)))
        rows = []
        for expl in members:
            scale = colour_scale(expl, shared_scale)
            for i, step in enumerate(expl.steps):
                end = (scale.row_end(i) or f"\u00b1{number(scale.hi)}") if scale.diverging else \
                    f"{scale.ends[0]}..{scale.ends[1]}"
                cells = "".join(
                    f'<td class="c" style="background:{rgb(u)};color:{ink(u)}" title="score {s:.4f} | raw {r:.4g}">'
                    + (html.escape(number(v)) if numbers else "&nbsp;") + "</td>"
                    for u, v, s, r in zip(scale.unit[i], scale.values[i], step.scores, step.raw, strict=True))
                rows.append(f"<tr><td><b>{html.escape(expl.method)}</b></td><td class='meta'>"
                            f"{html.escape(expl.model)}</td><td><code>{html.escape(repr(step.token))}</code></td>"
                            f"<td class='meta'>{html.escape(end)}</td>{cells}</tr>")
        tables.append('<div class="wide"><table class="grid"><tr><th>method</th><th>model</th><th>step</th>'
                      f"<th>scale</th>{head}</tr>" + "\n".join(rows) + "</table></div>" + sources_grid_html(members))
    return f'{STYLE}<div class="llmattr">{bars}' + "<br>".join(tables) + "</div>"


def sources_grid_html(members: Sequence[Shown]) -> str:
    """Explanations of one text side by side at source level: a row per source and a bar per method, its total over
    the whole answer (each column over its own largest ``|value|``; each method's own view has its steps), in a box
    that scrolls rather than leave the page; "" where the text has no sources."""
    members = [expl for expl in members if getattr(expl, "sources", None) is not None]
    if not members:
        return ""
    views = [source_view(expl, max_steps=0) for expl in members]
    head = "".join(f"<th>{html.escape(expl.method)}<br><span class='meta'>{html.escape(view.columns[0])}</span></th>"
                   for expl, view in zip(members, views, strict=True))
    rows = []
    for i, name in enumerate(views[0].names):
        bars = "".join(bar_cell(view.unit[i, 0], view.values[i, 0]) for view in views)
        rows.append(f"<tr><td><b>{html.escape(name)}</b></td><td class='src'>{html.escape(views[0].excerpts[i])}"
                    f"</td>{bars}</tr>")
    return ('<div class="wide"><p class="meta">sources: the sum of each source\'s token scores over the whole answer, '
            f"per method</p><table><tr><th>source</th><th>text</th>{head}</tr>" + "\n".join(rows) + "</table></div>")


_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>llmattr: {title}</title>
<style>body{{margin:2em}}</style></head><body>
<h2 style="font-family:system-ui,sans-serif">{title}</h2>
{body}
</body></html>
"""


def page(title: str, body: str) -> str:
    """A self-contained HTML page around view fragments."""
    return _PAGE.format(title=html.escape(title), body=body)


def to_html(expl: Shown, numbers: bool = False, shared_scale: bool = False) -> str:
    """A self-contained page with one row per generated token; hover shows each token's value."""
    return page(f"{expl.method} on {expl.task or 'text'}", heatmap_html(expl, numbers, shared_scale))


def grid_page(explanations: Sequence[Shown], numbers: bool = False, shared_scale: bool = False) -> str:
    """A self-contained page of :func:`grid_html`, titled by its methods ("side by side" when several) and its
    number of texts."""
    methods = list(dict.fromkeys(expl.method for expl in explanations))
    texts = len(dict.fromkeys(expl.text for expl in explanations))
    title = ", ".join(methods) + (" side by side" if len(methods) > 1 else "")
    return page(title + (f" on {texts} texts" if texts > 1 else ""), grid_html(explanations, numbers, shared_scale))
