"""Report tables from a hand-written store: means, Avg row, ranks, formats, determinism, HTML top tokens."""

from __future__ import annotations

import pytest

from llmattr.errors import LlmattrError
from llmattr.explanation import Explanation, Step
from llmattr.report import build_report, parse_formats
from llmattr.report.html import strip_timings, top_tokens
from llmattr.report.tables import paper_tables, to_csv, to_latex, to_markdown
from llmattr.store import MetricOutput, Results, Row, Store, Unit, canonical

# per (dataset, method): AUC pi-Soft-NS of two examples
NS = {("sst2", "grad-ellm"): (0.50, 0.70), ("sst2", "random"): (0.40, 0.40), ("sst2", "attention"): (0.55, 0.65),
      ("imdb", "grad-ellm"): (0.30, 0.30), ("imdb", "random"): (0.50, 0.54), ("imdb", "attention"): (0.20, 0.30)}


def explanation(method: str, scores: list[float]) -> str:
    tokens = ["<s>", "a", " good", " film", " indeed", "</s>"]
    step = Step(token="Positive", token_id=9, raw=scores, scores=scores, position=5)
    text = "".join(tokens)
    offsets, at = [], 0
    for tok in tokens:
        offsets.append((at, at + len(tok)))
        at += len(tok)
    return Explanation(model="tiny", method=method, params={}, tokens=tokens, token_ids=list(range(6)),
                       span=(1, 5), steps=[step], text=text, offsets=offsets, generated="Positive",
                       example={"label": "positive"}).to_json()


def fill(path, seconds: float = 0.5) -> None:
    with Store(path) as store:
        store.check_settings("tiny", {"samples": 2, "seed": 0})
        for (dataset, method), values in NS.items():
            for i, value in enumerate(values):
                rows = [Row("pi_soft_ns_auc", value), Row("pi_soft_nc_auc", 1 - value),
                        Row("pi_soft_ns", value / 2, pi=0.25), Row("pi_soft_ns", value, pi=0.75)]
                scores = [0.1 * (i + 1), 0.9, 0.2, 0.0] if method != "random" else [0.5, 0.4, 0.6, 0.3]
                store.write(Unit("tiny", dataset, f"{dataset}-{i}", method, canonical({})),
                            explanation(method, scores), seconds, [MetricOutput("pi-soft", "dynamic", 0.1, rows)])


def test_table1_means_avg_and_marks(tmp_path):
    fill(tmp_path / "r.sqlite")
    table = paper_tables(Results([tmp_path / "r.sqlite"]), "tiny")[0]
    assert table.name == "table1_pi_soft_auc" and table.columns == ["attention", "grad-ellm", "random"]
    ns = {name: [c.text for c in cells] for name, cells in table.sections[0].rows}
    assert ns == {"IMDb": ["0.250", "0.300", "0.520"], "SST2": ["0.600", "0.600", "0.400"],
                  "Avg": ["0.425", "0.450", "0.460"]}
    avg = dict(table.sections[0].rows)["Avg"]
    assert [c.rank for c in avg] == [3, 2, 1]
    assert [c.rank for c in dict(table.sections[0].rows)["SST2"]] == [None] * 3  # marks on the Avg row only
    md = to_markdown(table)
    assert "| Avg | 0.425³ | 0.450² | **0.460**¹ |" in md
    assert "| *AUC π-Soft-NC ↑* | | | |" in md
    assert r"\textbf{0.460}" in to_latex(table) and r"AUC $\pi$-Soft-NS $\uparrow$" in to_latex(table)
    assert "table1_pi_soft_auc,AUC π-Soft-NS ↑,Avg,random,0.460,1" in to_csv(table)


def test_report_is_deterministic_and_keeps_timings_apart(tmp_path):
    fill(tmp_path / "a.sqlite", seconds=0.5)
    fill(tmp_path / "b.sqlite", seconds=0.7)  # same results, other wall times
    _, first = build_report([tmp_path / "a.sqlite"], tmp_path / "ra", parse_formats("all"))
    _, second = build_report([tmp_path / "b.sqlite"], tmp_path / "rb", parse_formats("all"))
    names = sorted(p.name for p in first)
    assert names == sorted(p.name for p in second)
    assert {"report.md", "report.html", "tables.tex", "table6_time.md", "fig6_score_distribution.png",
            "fig3_pi_curves_imdb_dynamic.png", "fig3_pi_curves_sst2_dynamic.png"} <= set(names)
    for a, b in zip(sorted(first), sorted(second), strict=True):
        if a.stem == "table6_time":
            assert a.read_bytes() != b.read_bytes()
        elif a.suffix == ".html":
            assert a.read_bytes() != b.read_bytes()
            assert strip_timings(a.read_text()) == strip_timings(b.read_text())
        else:
            assert a.read_bytes() == b.read_bytes(), a.name
    md = (tmp_path / "ra" / "report.md").read_text()
    assert "Table 6" not in md and "Table 1" in md and "![fig6_score_distribution]" in md
    assert "0.500" in (tmp_path / "ra" / "table6_time.md").read_text()
    page = (tmp_path / "ra" / "report.html").read_text()
    assert page.count("data:image/png;base64,") == 3 and 'class="rank1"' in page and 'class="bars"' in page


def test_top_tokens_marks_top_ten_percent():
    expl = Explanation.from_json(explanation("grad-ellm", [0.2, 0.9, 0.2, 0.0]))
    assert top_tokens(expl) == {1}  # ceil(10% of 4) = 1 token
    assert top_tokens(expl, fraction=0.5) == {0, 1}  # tie at 0.2 broken by position


def test_bad_input():
    with pytest.raises(LlmattrError, match="valid: md, latex, csv, html, all"):
        parse_formats("md,pdf")


def test_empty_store_is_refused(tmp_path):
    Store(tmp_path / "e.sqlite").close()
    with pytest.raises(LlmattrError, match="no finished examples"):
        build_report([tmp_path / "e.sqlite"], tmp_path / "out")


def test_layer_sweep_figure(tmp_path):
    """Fig. 5 appears for a Grad-ELLM --layers sweep; 'all' is plotted at the model's layer count."""
    from llmattr.report.figures import layer_sweep

    with Store(tmp_path / "r.sqlite") as store:
        store.check_settings("tiny", {"n_layers": 2})
        for layers, value in ((1, 0.4), ("all", 0.6)):
            params = canonical({"attention": "loosened", "layers": layers, "relu": "per-layer", "similarity": "dot"})
            store.write(Unit("tiny", "sst2", "ex", "grad-ellm", params), explanation("grad-ellm", [0.1, 0.9, 0.2, 0.0]),
                        0.1, [MetricOutput("pi-soft", "dynamic", 0.1, [Row("pi_soft_ns_auc", value),
                                                                      Row("pi_soft_nc_auc", value)])])
    paths = layer_sweep(Results([tmp_path / "r.sqlite"]), "tiny", tmp_path)
    assert [p.name for p in paths] == ["fig5_layers_grad-ellm.png"]


def test_a_method_has_one_colour_in_every_figure_and_the_html(tmp_path, monkeypatch):
    import llmattr.report.figures as figures
    from llmattr.plotting import method_colors

    fill(tmp_path / "r.sqlite")
    seen, draw = [], figures.plot_pi_curves
    monkeypatch.setattr(figures, "plot_pi_curves",
                        lambda results, path, title=None, colors=None: seen.append(colors) or draw(results, path,
                                                                                                    title, colors))
    build_report([tmp_path / "r.sqlite"], tmp_path / "out", parse_formats("html"))
    colors = method_colors(["random", "attention", "grad-ellm"])
    assert list(colors) == ["attention", "grad-ellm", "random"] and len(set(colors.values())) == 3
    assert len(seen) == 2 and all(c == colors for c in seen)  # both datasets' pi-curves
    page = (tmp_path / "out" / "report.html").read_text()
    for label, color in colors.items():
        assert f'<i style="background:{color}"></i>{label}' in page  # the qualitative examples' legend
