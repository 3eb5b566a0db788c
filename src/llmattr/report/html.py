"""The self-contained HTML report: tables, embedded PNG figures and qualitative examples (paper 000 Fig. 4).

Qualitative examples mark, for each method, the content tokens among its top 10% scores (mean retain
probability over the explained steps; ties by position) with a coloured bar above the token, as in
Fig. 4. The timing table sits between ``<!-- timings -->`` and ``<!-- /timings -->`` so a byte
comparison of two reports can strip it (wall times differ run to run); everything else is deterministic.
"""

from __future__ import annotations

import base64
import html
import json
import math
from collections import defaultdict

from ..display import span_display
from ..plotting import method_colors
from ..store import Results
from .figures import Figure
from .model import Table
from .writers import settings_lines, to_html

TIMINGS_START, TIMINGS_END = "<!-- timings -->", "<!-- /timings -->"
CSS = """
body{font-family:system-ui,sans-serif;margin:2em auto;max-width:1200px;color:#222}
table{border-collapse:collapse;margin:.5em 0 1.5em;font-size:14px}
th,td{padding:3px 8px;border-bottom:1px solid #ddd;text-align:right}
thead th,tbody th{text-align:left}
tr.section td{text-align:left;font-style:italic;background:#f4f4f4}
td.rank1{color:#d62728;font-weight:bold} td.rank2{color:#1f77b4;font-weight:bold} td.rank3{color:#2ca02c}
.control{color:#888} details{font-size:13px;margin:-1em 0 1.5em}
figure{margin:1em 0} figcaption{font-size:14px;margin-bottom:.3em} img{max-width:100%}
.example{border:1px solid #ddd;padding:.6em;margin:1em 0}
.tok{display:inline-flex;flex-direction:column;vertical-align:bottom;margin:0 1px 6px 0;white-space:pre}
.bars{display:flex;flex-direction:column;gap:1px;margin-bottom:2px}
.bars i{display:block;height:3px}
.legend span{display:inline-block;margin-right:1em;font-size:13px}
.legend i{display:inline-block;width:14px;height:8px;margin-right:4px}
.meta{font-size:13px;color:#555}
"""


def top_tokens(expl: dict, fraction: float = 0.1) -> set[int]:
    """Indices (within the content span) of the top ``fraction`` tokens by mean retain probability of an
    Explanation's JSON dict."""
    steps = [s["scores"] for s in expl["steps"]]
    m = len(steps[0]) if steps else 0
    if m == 0:
        return set()
    score = [math.fsum(row[i] for row in steps) / len(steps) for i in range(m)]
    k = max(1, math.ceil(fraction * m))
    return set(sorted(range(m), key=lambda i: (-score[i], i))[:k])


def qualitative(results: Results, model: str, per_dataset: int = 3, fraction: float = 0.1) -> str:
    """Fig. 4: the first examples (by id) that every method explained, top tokens marked per method."""
    by_example: dict = defaultdict(dict)
    for dataset, method, params, example, text, _seconds in results.explanations(model):
        by_example[(dataset, example)][results.label(method, params)] = text
    labels = sorted({label for methods in by_example.values() for label in methods})
    colors = method_colors(labels)  # the figures' colours
    legend = "".join(f'<span><i style="background:{colors[label]}"></i>{html.escape(label)}</span>'
                     for label in labels)
    parts = [f'<p class="legend">{legend}</p>']
    for dataset in sorted({d for d, _ in by_example}, key=results.dataset_key):
        complete = sorted(ex for (d, ex), methods in by_example.items()
                          if d == dataset and len(methods) == len(labels))
        for example in complete[:per_dataset]:
            expls = {label: json.loads(text) for label, text in by_example[(dataset, example)].items()}
            parts.append(_example_html(results.dataset_name(dataset), example, expls, colors, fraction))
    return "\n".join(parts)


def _example_html(dataset: str, example: str, expls: dict[str, dict], colors: dict,
                  fraction: float) -> str:
    labels = sorted(expls)
    first = expls[labels[0]]
    tops = {label: top_tokens(expls[label], fraction) for label in labels}
    tokens = []
    shown = span_display(first["tokens"], first.get("offsets", []), first.get("text", ""), first["span"],
                         [s["token"] for s in first["steps"]])
    for i, token in enumerate(shown):
        bars = "".join(f'<i style="background:{colors[label]}"></i>' if i in tops[label] else "<i></i>"
                       for label in labels)
        tokens.append(f'<span class="tok"><span class="bars">{bars}</span><span>{html.escape(token)}</span></span>')
    gold = first.get("example", {}).get("label")
    meta = (f"{html.escape(dataset)} · {html.escape(example)} · model answer "
            f"<b>{html.escape(first.get('generated', ''))}</b>")
    if gold:
        meta += f" · gold <b>{html.escape(str(gold))}</b>"
    return f'<div class="example"><p class="meta">{meta}</p>{"".join(tokens)}</div>'


def _figure(figure: Figure) -> str:
    data = base64.b64encode(figure.path.read_bytes()).decode()
    return (f"<figure><figcaption><b>{html.escape(figure.path.name)}</b>. {html.escape(figure.caption)}"
            f'</figcaption><img src="data:image/png;base64,{data}"></figure>')


def page(results: Results, model: str, tables: list[Table], figures: list[Figure], resamples: int) -> str:
    """The whole HTML report of one model."""
    settings = settings_lines(results, model, resamples)
    body = [f"<h1>llmattr report: {html.escape(model)}</h1>",
            '<p class="meta">' + "<br>".join(map(html.escape, settings)) + "</p>",
            "<h2>Tables</h2>"]
    for table in tables:
        block = to_html(table)
        body.append(block if table.deterministic else f"{TIMINGS_START}\n{block}\n{TIMINGS_END}")
    body += ["<h2>Figures</h2>", *map(_figure, figures),
             "<h2>Qualitative examples (top 10% tokens per method)</h2>", qualitative(results, model)]
    return ("<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>llmattr report</title>"
            f"<style>{CSS}</style></head><body>\n" + "\n".join(body) + "\n</body></html>\n")
