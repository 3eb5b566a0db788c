"""Show an Explanation: a coloured token heatmap in the terminal (rich), inline/self-contained HTML.

Colour scales (shared with the matrix figure of :mod:`llmattr.plotting`, :func:`colour_scale`):

- signed methods: a diverging scale of the raw scores, blue (negative) - white (0) - red (positive),
  symmetric about 0 (``|raw| / max |raw|``), so a strongly negative token is as visible as a positive one;
- unsigned methods: white (0) to red (1) of the score in [0, 1] (each step min-max'd, the retain
  probabilities the metrics use) or, with ``shared_scale``, of the raw scores over all steps at once.

Tokens show their own characters of the text (``Explanation.display_tokens``), so Arabic, CJK, emoji
and combining accents are printed exactly. Where colour is not visible (output piped into a file or a
CI log) the terminal view prints each token's value after it; ``numbers=True`` forces it.
"""

from __future__ import annotations

import html
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
from rich.console import Console
from rich.table import Table
from rich.text import Text

if TYPE_CHECKING:  # the Explanation imports this module for its notebook views
    from .explanation import Explanation

WHITE = np.array([255.0, 255.0, 255.0])
RED = np.array([214.0, 39.0, 40.0])  # matplotlib's tab:red
BLUE = np.array([31.0, 119.0, 180.0])  # matplotlib's tab:blue


@dataclass
class Scale:
    """How an Explanation's values become colours.

    ``values`` ``(steps, tokens)`` are the numbers shown, ``unit`` the same mapped to [-1, 1] (diverging)
    or [0, 1] (sequential), ``lo``/``hi`` the values at the ends of the colour bar.
    """

    values: np.ndarray
    unit: np.ndarray
    diverging: bool
    lo: float
    hi: float
    label: str


def colour_scale(expl: Explanation, shared_scale: bool = False) -> Scale:
    """The colour scale of ``expl`` (module docstring); ``shared_scale`` uses one scale for every step."""
    if expl.signed:
        raw = expl.to_numpy(raw=True)
        peak = np.abs(raw).max(axis=None if shared_scale else 1, keepdims=True)
        unit = np.divide(raw, peak, out=np.zeros_like(raw), where=peak > 0)
        top = float(np.abs(raw).max(initial=0.0))
        what = "one scale for all steps" if shared_scale else "each step scaled by its max |raw|"
        return Scale(raw, unit, True, -top, top, f"raw score (signed; {what})")
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


def ink(u: float) -> str:
    """Text colour readable on :func:`shade` ``(u)``."""
    return "white" if abs(u) > 0.65 else "black"


def number(value: float) -> str:
    return f"{value:.2f}" if 0.01 <= abs(value) < 100 or value == 0 else f"{value:.1e}"


def _visible(token: str) -> str:
    return token.replace("\n", "\u21b5")


def heatmap_text(tokens: list[str], unit, values=None) -> Text:
    """One row of tokens on their colours; with ``values``, each token followed by its value."""
    text = Text()
    for i, (token, u) in enumerate(zip(tokens, unit, strict=True)):
        text.append(_visible(token), style=f"{ink(u)} on rgb{shade(u)}")
        if values is not None:
            text.append(f"[{number(values[i])}]", style="dim")
    return text


def print_explanation(expl: Explanation, console: Console | None = None, max_steps: int = 20,
                      numbers: bool | None = None, shared_scale: bool = False) -> None:
    """The answer, then one heatmap row per generated token over the content span.

    ``numbers`` (default: when the console is not a terminal, e.g. piped or in CI) prints each value.
    """
    console = console or Console()
    numbers = not console.is_terminal if numbers is None else numbers
    scale = colour_scale(expl, shared_scale)
    console.print(f"[bold]model[/] {expl.model}  [bold]method[/] {expl.method}  [bold]answer[/] "
                  f"{expl.generated!r}" + ("  (forced)" if expl.forced else ""), highlight=False)
    ends = "blue < 0 < red" if scale.diverging else f"white {number(scale.lo)} .. red {number(scale.hi)}"
    table = Table(show_header=True, header_style="bold", box=None, pad_edge=False)
    table.add_column("step")
    table.add_column("token")
    table.add_column(f"content span: {scale.label}, {ends}", overflow="fold")
    tokens = expl.span_display
    for i, step in enumerate(expl.steps[:max_steps]):
        table.add_row(str(i), repr(step.token), heatmap_text(tokens, scale.unit[i],
                                                             scale.values[i] if numbers else None))
    console.print(table)
    if len(expl.steps) > max_steps:
        console.print(f"... {len(expl.steps) - max_steps} more steps (see --html / --json)")
    for warning in expl.warnings:
        console.print(f"[yellow]warning:[/] {warning}")


_STYLE = """<style>
.llmattr{{font-family:system-ui,sans-serif;color:#222}}
.llmattr table{{border-collapse:collapse}}
.llmattr td,.llmattr th{{padding:4px 8px;vertical-align:top;border-bottom:1px solid #eee;text-align:left}}
.llmattr .tok{{white-space:pre-wrap;border-radius:3px;padding:1px 1px;margin:0 1px;cursor:default;
 display:inline-block;min-width:4px;line-height:1.5}}
.llmattr .num{{display:block;font-size:70%;opacity:.8;text-align:center}}
.llmattr .meta{{color:#555;font-size:90%}}
.llmattr .bar{{display:inline-block;width:220px;height:12px;vertical-align:middle;border:1px solid #ccc;
 background:linear-gradient(to right,{gradient})}}
</style>"""


def _colour_bar(scale: Scale) -> str:
    stops = [-1.0, 0.0, 1.0] if scale.diverging else [0.0, 1.0]
    gradient = ",".join(f"rgb{shade(u)}" for u in stops)
    return (_STYLE.format(gradient=gradient)
            + f'<p class="meta">{html.escape(number(scale.lo))} <span class="bar"></span> '
            f'{html.escape(number(scale.hi))} &nbsp; {html.escape(scale.label)}</p>')


def heatmap_html(expl: Explanation, numbers: bool = False, shared_scale: bool = False) -> str:
    """The heatmap as an HTML fragment (a notebook's ``_repr_html_``): one row per generated token,
    hover shows each token's score and raw value; ``numbers`` writes them in the cells."""
    scale = colour_scale(expl, shared_scale)
    tokens = expl.span_display
    rows = []
    for i, step in enumerate(expl.steps):
        cells = "".join(
            f'<span class="tok" style="background:rgb{shade(u)};color:{ink(u)}" '
            f'title="score {score:.4f} | raw {raw:.4g}">{html.escape(_visible(tok))}'
            + (f'<span class="num">{html.escape(number(v))}</span>' if numbers else "") + "</span>"
            for tok, u, v, score, raw in zip(tokens, scale.unit[i], scale.values[i], step.scores, step.raw,
                                              strict=True)
        )
        rows.append(f"<tr><td>{i}</td><td><code>{html.escape(repr(step.token))}</code></td>"
                    f"<td dir='auto'>{cells}</td></tr>")
    warnings = "".join(f'<p class="meta">warning: {html.escape(w)}</p>' for w in expl.warnings)
    return (
        f'<div class="llmattr">{_colour_bar(scale)}'
        f'<p class="meta">model <b>{html.escape(expl.model)}</b> &middot; method <b>{html.escape(expl.method)}</b>'
        f' &middot; params {html.escape(str(expl.params))} &middot; answer <b>{html.escape(repr(expl.generated))}</b>'
        f'{" (forced)" if expl.forced else ""}</p>'
        '<table><tr><th>step</th><th>token</th><th>content span</th></tr>' + "\n".join(rows)
        + f"</table>{warnings}</div>"
    )


_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>llmattr: {title}</title>
<style>body{{margin:2em}}</style></head><body>
<h2 style="font-family:system-ui,sans-serif">{title}</h2>
{body}
</body></html>
"""


def to_html(expl: Explanation, numbers: bool = False, shared_scale: bool = False) -> str:
    """A self-contained page with one row per generated token; hover shows each token's value."""
    return _PAGE.format(title=html.escape(f"{expl.method} on {expl.task or 'text'}"),
                        body=heatmap_html(expl, numbers, shared_scale))
