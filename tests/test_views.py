"""What a person sees: the terminal heatmap's colours (rich, colour forced), colour bars that state the scale
the cells use and stay with their own heatmap, HTML that keeps joining scripts joined, the method grid, and
the notebook helpers (repr, dir, numpy views)."""

import io
import re
import subprocess
import sys

import numpy as np
import pytest
import torch
from rich.console import Console

import llmattr
from llmattr import render
from llmattr.explanation import Explanation, Explanations

TOKENS = [" An", " engross", "ing", " film", " never", " boring", "."]


def synthetic(raw, signed=True, method="m", text=None):
    """An Explanation of ``raw`` ``(steps, tokens)`` over :data:`TOKENS` (no model)."""
    raw = torch.as_tensor(raw, dtype=torch.float64)
    n = raw.shape[0]
    return Explanation.from_raw(raw, signed, step_tokens=[f"t{i}" for i in range(n)], step_ids=list(range(n)),
                                positions=list(range(n)), model="tiny", method=method, params={},
                                tokens=TOKENS, token_ids=list(range(len(TOKENS))), span=(0, len(TOKENS)),
                                text=text or "".join(TOKENS))


def ansi(expl, **kwargs) -> str:
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, color_system="truecolor", width=200)
    render.print_explanation(expl, console, **kwargs)
    return out.getvalue()


def background(rgb: tuple[int, int, int]) -> str:
    return "48;2;{};{};{}m".format(*rgb)


def test_terminal_heatmap_is_coloured_through_rich():
    expl = synthetic([[2.0, -1.0, 0.5, 0.0, -2.0, 1.0, 0.25]])
    out = ansi(expl, numbers=False)
    # +max is tab:red with (bright) white ink, -max/2 is half way from white to tab:blue with black ink
    assert "\x1b[97;" + background((214, 39, 40)) + " An" in out
    assert "\x1b[30;" + background(render.shade(-0.5)) + " engross" in out
    assert render.shade(-0.5) == (143, 187, 218)
    assert "\x1b[97;" + background((31, 119, 180)) + " never" in out


def test_terminal_numbers_never_wrap_inside_a_number():
    expl = synthetic(np.linspace(-1, 1, len(TOKENS))[None], text="".join(TOKENS))
    expl.tokens = ["这部", "电影", "很", "好", "看", "。", "！"]
    out = io.StringIO()
    render.print_explanation(expl, Console(file=out, width=40), numbers=True)
    lines = out.getvalue().splitlines()
    assert sum(line.count("[") for line in lines) == len(TOKENS)
    assert all(line.count("[") == line.count("]") for line in lines), lines


def bars(page: str) -> list[tuple[str, str, str]]:
    """(low label, gradient, high label) of every colour bar in ``page``."""
    return re.findall(r'<span class="lo">([^<]*)</span> <span class="bar" style="background:linear-gradient'
                      r'\(to right,(.*?)\)"></span> <span class="hi">([^<]*)</span>', page)


def test_signed_multi_step_bar_states_the_scale_each_row_uses():
    expl = synthetic([[3.0, -1.5, 0, 0, 0, 0, 0], [1.0, -0.5, 0, 0, 0, 0, 0]])
    page = render.heatmap_html(expl)
    [(lo, _, hi)] = bars(page)
    assert (lo, hi) == ("-max", "+max")  # not the global +-3 while row 1 is coloured by its own max 1
    rows = page.split("<tr>")[2:]
    assert "<td>\u00b13.00</td>" in rows[0] and "<td>\u00b11.00</td>" in rows[1]
    for row in rows:  # each row's max is full red, -max/2 half blue: the row's label is its scale
        cells = re.findall(r"background:(rgb\([^)]*\))", row)
        assert cells[:2] == [render.rgb(1.0), render.rgb(-0.5)]
    # one step, or a shared scale: the bar's ends are the numbers the cells are scaled by
    assert [(lo, hi) for lo, _, hi in bars(render.heatmap_html(synthetic([[3.0, -1.5, 0, 0, 0, 0, 0]])))] == \
        [("-3.00", "3.00")]
    shared = render.heatmap_html(expl, shared_scale=True)
    assert [(lo, hi) for lo, _, hi in bars(shared)] == [("-3.00", "3.00")]
    assert re.findall(r"background:(rgb\([^)]*\))", shared.split("<tr>")[3])[0] == render.rgb(1 / 3)
    assert "blue -max < 0 < red +max" in ansi(expl) and "\u00b13.00" in ansi(expl)


def test_two_heatmaps_on_one_page_keep_their_own_bars():
    signed, unsigned = synthetic([[1.0, -1.0, 0, 0, 0, 0, 0]]), synthetic([[1.0, 0.5, 0, 0, 0, 0, 0]], False)
    page = signed._repr_html_() + unsigned._repr_html_()
    (_, first, _), (_, second, _) = bars(page)
    assert first == ",".join(map(render.rgb, (-1.0, 0.0, 1.0))) and second == render.rgb(0.0) + "," + render.rgb(1.0)
    css = "".join(re.findall(r"<style>(.*?)</style>", page, re.S))
    assert "gradient" not in css  # no page-wide rule a later heatmap could override


def test_html_tokens_are_plain_inline_so_scripts_join():
    arabic = "مرحبا بالعالم"
    expl = synthetic(np.linspace(0, 1, len(TOKENS))[None], signed=False)
    expl.tokens, expl.text = ["مر", "حبا", " بال", "عا", "", "لم", "!"], arabic + "!"
    page = render.heatmap_html(expl)
    rule = re.search(r"\.llmattr \.tok\{([^}]*)\}", page).group(1)
    assert "inline-block" not in rule and "padding" not in rule and "margin" not in rule
    cells = re.findall(r'<span class="tok"[^>]*>([^<]*)</span>', page)
    assert "".join(cells) == arabic + "!" and "" in cells  # an empty token is an empty inline span: no sliver


def test_explanation_to_html_and_repr(tmp_path):
    expl = synthetic([[1.0, -1.0, 0, 0, 0, 0, 0]])
    page = expl.to_html(tmp_path / "e.html", numbers=True)
    assert page.startswith("<!doctype html>") and (tmp_path / "e.html").read_text(encoding="utf-8") == page
    assert '<span class="num">1.00</span>' in page
    assert repr(expl) == "Explanation(method='m', model='tiny', answer='', steps=1, tokens=7, task=None)"
    many = Explanations([expl, synthetic([[0.5] * 7], False, method="n")], examples=[0, 0], failed={1: "empty"})
    assert repr(many) == "Explanations(2 of 1 text(s); methods m, n; failed {1: 'empty'})"


def test_method_grid_aligns_tokens_and_scales_each_row():
    signed = synthetic([[2.0, -1.0, 0, 0, 0, 0, 0], [1.0, 0, 0, 0, 0, 0, -0.5]], method="saliency-ish")
    unsigned = synthetic([[0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0]], signed=False, method="grad-ellm")
    grid = Explanations([signed, unsigned])
    page = grid._repr_html_()
    assert page.count('<table class="grid">') == 1  # one text: one grid
    head = re.findall(r'<th class="c">([^<]*)</th>', page)
    assert head == TOKENS
    rows = re.findall(r"<tr><td><b>([^<]*)</b>.*?</tr>", page, re.S)
    assert rows == ["saliency-ish", "saliency-ish", "grad-ellm"]
    body = page.split("<tr><td><b>")[1:]
    colours = [re.findall(r'<td class="c" style="background:(rgb\([^)]*\))', row) for row in body]
    assert all(len(c) == len(TOKENS) for c in colours)  # a cell per token column in every row
    assert colours[0][:2] == [render.rgb(1.0), render.rgb(-0.5)] and colours[1][6] == render.rgb(-0.5)
    assert colours[2][6] == render.rgb(1.0) and colours[2][0] == render.rgb(0.0)
    assert "\u00b12.00" in body[0] and "\u00b11.00" in body[1] and "0.00..1.00" in body[2]
    assert [lo for lo, _, _ in bars(page)] == ["-max", "min"]  # a bar per kind of scale
    two_texts = Explanations([signed, synthetic([[1.0] * 7], text="other text")])
    assert two_texts._repr_html_().count('<table class="grid">') == 2


def test_collection_to_pandas_has_method_model_example_and_step():
    a, b = synthetic([[1.0, -1.0, 0, 0, 0, 0, 0]], method="a"), synthetic([[0.5] * 7, [1.0] * 7], False, "b")
    frame = Explanations([a, b, a], examples=[0, 0, 3]).to_pandas()
    assert list(frame.columns[:5]) == ["method", "model", "example", "step", "target"]
    assert len(frame) == 7 * (1 + 2 + 1)
    assert frame.groupby(["method", "example"]).size().to_dict() == {("a", 0): 7, ("a", 3): 7, ("b", 0): 14}
    row = frame[(frame.method == "b") & (frame.step == 1)].iloc[0]
    assert row.raw == 1.0 and row.model == "tiny"


def test_dir_lists_the_public_names():
    names = dir(llmattr)
    assert {"explain", "evaluate", "from_scores", "tokens", "Explanation", "Explanations", "load_model"} <= set(names)


def test_soft_result_prints_one_line():
    from llmattr.faithfulness.soft import SoftResult

    result = SoftResult(pis=[0.0, 1.0], pi_soft_ns=[0.0, 0.5], pi_soft_nc=None, soft_ns=0.25, soft_nc=None,
                        expected_retained=3.0, routing="dynamic", samples=15, seed=0, mode="greedy")
    assert repr(result) == ("SoftResult(auc_ns=0.2500, soft_ns=0.2500, expected_retained=3.0000; dynamic routing, "
                            "15 samples, 2 pis)")


def test_methods_listing_is_readable_at_80_columns():
    from typer.testing import CliRunner

    from llmattr import methods
    from llmattr.cli.app import app

    result = CliRunner().invoke(app, ["methods"], env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert max(len(line.rstrip()) for line in lines) <= 80
    words = {word for line in lines for word in line.split()}
    for name in methods.available():
        cls = methods.REGISTRY[name]
        assert name in words  # never folded inside a name or a word of its summary
        assert set(cls.summary.split()) <= words, name


def test_fig6_title_fits_a_long_model_name(tmp_path, monkeypatch):
    import shutil
    import sqlite3
    from pathlib import Path

    from llmattr.report import figures
    from llmattr.store import Results

    store = tmp_path / "r.sqlite"
    shutil.copy(Path(__file__).parent / "data" / "report_store.sqlite", store)
    long_name = "HuggingFaceTB/SmolLM2-135M-Instruct-a-rather-long-fine-tuned-variant-name"
    with sqlite3.connect(store) as conn:
        (model,) = conn.execute("SELECT DISTINCT model FROM explanations").fetchone()
        conn.execute("UPDATE explanations SET model = ?", (long_name,))
    kept = []
    monkeypatch.setattr(figures, "_save", lambda fig, path: kept.append(fig) or path)
    assert model != long_name and figures.score_distributions(Results([store]), long_name, tmp_path)
    fig = kept[0]
    fig.canvas.draw()
    [title] = fig.texts  # the suptitle
    box, frame = title.get_window_extent(), fig.bbox
    assert long_name in title.get_text().replace("\n", "") and title.get_text().count("\n") >= 1
    assert frame.x0 <= box.x0 and box.x1 <= frame.x1 and box.y1 <= frame.y1, (box, frame)


def test_notebook_progress_and_imports_print_no_widget_warnings(monkeypatch):
    """A Jupyter kernel without ipywidgets: rich's live bar warns 'install "ipywidgets"' and tqdm.auto (imported
    by the Hugging Face libraries) 'IProgress not found'; llmattr's bars and imports show neither."""
    import importlib.util
    import warnings

    import rich.console
    from rich.progress import track

    from llmattr import api

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(rich.console, "_is_jupyter", lambda: True)
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "ipywidgets" else
                        find_spec(name, *a))
    with pytest.warns(UserWarning, match="ipywidgets"):  # what rich alone does here
        list(track(range(2), console=rich.console.Console(file=io.StringIO())))
    console = api.progress_console()
    console.file = io.StringIO()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert list(track(range(2), console=console)) == [0, 1]
    code = ("import warnings, llmattr\n"
            "for text in ('IProgress not found. Please update jupyter and ipywidgets.', 'another warning'):\n"
            "    warnings.warn_explicit(text, UserWarning, 'auto.py', 21, module='tqdm.auto')")
    shown = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stderr
    assert "another warning" in shown and "IProgress" not in shown  # llmattr's filter, as imported


def svg_texts(path) -> list[str]:
    """The text of every ``<text>`` element of an SVG written with ``svg.fonttype: none`` (text kept as text)."""
    import html

    return [html.unescape(t) for t in re.findall(r"<text[^>]*>([^<]*)</text>", path.read_text(encoding="utf-8"))]


def test_signed_multi_step_figure_writes_each_steps_peak_under_its_column(tmp_path):
    """The matrix figure's bar reads -max .. +max when each step has its own scale, so each step's max |raw|
    must be in the figure (issue 35: the label promised it, no figure showed it)."""
    from llmattr.plotting import plot_matrix

    raw = [[3.0, -1.5, 0, 0, 0, 0, 0], [1.0, -0.5, 0, 0, 0, 0, 0], [0.004, -0.001, 0, 0, 0, 0, 0]]
    texts = svg_texts(plot_matrix(synthetic(raw), tmp_path / "m.svg"))
    assert {"-max", "+max", "\u00b13.00", "\u00b11.00", "\u00b14.0e-03"} <= set(texts), texts
    assert texts.index("\u00b13.00") < texts.index("\u00b11.00") < texts.index("\u00b14.0e-03")  # step order
    # one scale for all steps: the bar's ends are the numbers themselves, and no per-step peak is written
    texts = svg_texts(plot_matrix(synthetic(raw), tmp_path / "shared.svg", shared_scale=True))
    assert {"-3.00", "3.00"} <= set(texts) and not any(t.startswith("\u00b1") for t in texts)
