"""Show an Explanation: a coloured token heatmap in the terminal (rich) and a self-contained HTML page."""

from __future__ import annotations

import html

from rich.console import Console
from rich.table import Table
from rich.text import Text

from .explanation import Explanation


def _shade(score: float) -> tuple[int, int, int]:
    """White (0) to saturated red (1)."""
    s = min(max(score, 0.0), 1.0)
    return 255, int(255 - 200 * s), int(255 - 200 * s)


def _visible(token: str) -> str:
    return token.replace("\n", "\u21b5")


def heatmap_text(tokens: list[str], scores: list[float]) -> Text:
    text = Text()
    for token, score in zip(tokens, scores, strict=True):
        r, g, b = _shade(score)
        text.append(_visible(token), style=f"black on rgb({r},{g},{b})")
    return text


def print_explanation(expl: Explanation, console: Console | None = None, max_steps: int = 20) -> None:
    """The answer, then one heatmap row per generated token over the content span."""
    console = console or Console()
    console.print(f"[bold]model[/] {expl.model}  [bold]method[/] {expl.method}  [bold]answer[/] "
                  f"{expl.generated!r}" + ("  (forced)" if expl.forced else ""), highlight=False)
    table = Table(show_header=True, header_style="bold", box=None, pad_edge=False)
    table.add_column("step")
    table.add_column("token")
    table.add_column("content span, shaded by score (white 0 .. red 1)")
    for i, step in enumerate(expl.steps[:max_steps]):
        table.add_row(str(i), repr(step.token), heatmap_text(expl.span_tokens, step.scores))
    console.print(table)
    if len(expl.steps) > max_steps:
        console.print(f"... {len(expl.steps) - max_steps} more steps (see --html / --json)")
    for warning in expl.warnings:
        console.print(f"[yellow]warning:[/] {warning}")


_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>llmattr: {title}</title>
<style>
body{{font-family:system-ui,sans-serif;margin:2em;color:#222}}
table{{border-collapse:collapse}} td{{padding:4px 8px;vertical-align:top;border-bottom:1px solid #eee}}
.tok{{white-space:pre;border-radius:3px;padding:1px 0;cursor:default}}
.meta{{color:#555;font-size:90%}}
</style></head><body>
<h2>{title}</h2>
<p class="meta">model <b>{model}</b> &middot; method <b>{method}</b> &middot; params {params}
&middot; answer <b>{answer}</b>{forced}</p>
<p class="meta">Each row explains one generated token: content tokens shaded by their score in [0, 1]
(hover for the value and the method's raw score).</p>
<table><tr><th>step</th><th>token</th><th>content span</th></tr>
{rows}
</table>
{warnings}
</body></html>
"""


def to_html(expl: Explanation) -> str:
    """A self-contained page with one row per generated token; hover shows each token's value."""
    rows = []
    for i, step in enumerate(expl.steps):
        cells = "".join(
            f'<span class="tok" style="background:rgb{_shade(score)}" '
            f'title="score {score:.4f} | raw {raw:.4g}">{html.escape(_visible(tok))}</span>'
            for tok, score, raw in zip(expl.span_tokens, step.scores, step.raw, strict=True)
        )
        rows.append(f"<tr><td>{i}</td><td><code>{html.escape(repr(step.token))}</code></td><td>{cells}</td></tr>")
    warnings = "".join(f'<p class="meta">warning: {html.escape(w)}</p>' for w in expl.warnings)
    return _PAGE.format(
        title=html.escape(f"{expl.method} on {expl.task or 'text'}"), model=html.escape(expl.model),
        method=html.escape(expl.method), params=html.escape(str(expl.params)),
        answer=html.escape(repr(expl.generated)), forced=" (forced)" if expl.forced else "",
        rows="\n".join(rows), warnings=warnings,
    )
