"""Report tables from a hand-written store: means and intervals, Avg row, paired tests and ranks, the
control column, formats, determinism, figures, HTML top tokens."""

from __future__ import annotations

import json
import statistics

import pytest

from conftest import strip_timings
from llmattr.api import catalog
from llmattr.errors import LlmattrError
from llmattr.explanation import Explanation, Step
from llmattr.report import build_report, parse_formats
from llmattr.report.html import top_tokens
from llmattr.report.layouts import paper_tables
from llmattr.report.writers import to_csv, to_latex, to_markdown
from llmattr.stats import estimate, paired_test
from llmattr.store import MetricOutput, Results, Row, Store, Unit, canonical

EXAMPLES = 8
METHODS = {"grad-ellm": 0.2, "saliency": 0.1, "attention": 0.1, "random": 0.0}  # planted offsets


def auc_ns(dataset: str, method: str, i: int) -> float:
    """Example i's AUC pi-Soft-NS: an example effect shared by the methods, the method's offset and a small
    method-specific wobble. grad-ellm and attention (same name length) differ by exactly 0.1 on every
    example; attention and saliency differ only by the wobble (mean difference -0.0025)."""
    shared = 0.3 + 0.05 * ((5 * i) % 8) + (0.05 if dataset == "imdb" else 0.0)
    return shared + METHODS[method] + 0.01 * ((3 * i + len(method)) % 5 - 2)


NS = {(d, m): [auc_ns(d, m, i) for i in range(EXAMPLES)] for d in ("sst2", "imdb") for m in METHODS}


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


def fill(path, seconds: float = 0.5, model: str = "tiny") -> None:
    with Store(path) as store:
        store.check_settings(model, {"samples": 2, "seed": 0})
        for (dataset, method), values in NS.items():
            for i, value in enumerate(values):
                rows = [Row("pi_soft_ns_auc", value, se=0.01), Row("pi_soft_nc_auc", 1 - value, se=0.03),
                        Row("pi_soft_ns", value / 2, x=0.25), Row("pi_soft_ns", value, x=0.75)]
                scores = [0.1 * (i + 1), 0.9, 0.2, 0.0] if method != "random" else [0.5, 0.4, 0.6, 0.3]
                store.write(Unit(model, dataset, f"{dataset}-{i}", method, canonical({})),
                            explanation(method, scores), seconds, [MetricOutput("pi-soft", "dynamic", 0.1, rows)])


def strata(method: str, *datasets: str) -> dict:
    return {d: {f"{d}-{i}": NS[(d, method)][i] for i in range(EXAMPLES)} for d in datasets}


def test_table1_means_intervals_tests_and_shared_ranks(tmp_path):
    fill(tmp_path / "r.sqlite")
    known = catalog()
    table = paper_tables(Results([tmp_path / "r.sqlite"], datasets=known.datasets), "tiny", tables=known.tables,
                         controls=known.controls)[0]
    assert table.name == "table1_pi_soft_auc"
    assert table.columns == ["attention", "grad-ellm", "saliency", "random"] and table.control == ("random",)
    rows = dict(table.sections[0].rows)
    for i, method in enumerate(table.columns):
        sst2, avg = rows["SST2"][i], rows["Avg"][i]
        assert sst2.value == pytest.approx(sum(NS[("sst2", method)]) / EXAMPLES)
        assert avg.value == pytest.approx((sum(NS[("sst2", method)]) + sum(NS[("imdb", method)])) / 2 / EXAMPLES)
        # the interval is the stratified bootstrap of the same examples (Avg: resampled within datasets)
        assert sst2.estimate == estimate(strata(method, "sst2"))
        assert avg.estimate == estimate(strata(method, "sst2", "imdb")) and avg.estimate.n == 16
        assert avg.text == f"{avg.value:.3f} ± {avg.estimate.half_width:.3f}" and avg.estimate.half_width > 0
        if method != "random":
            assert avg.p_control == paired_test(strata(method, "sst2", "imdb"), strata("random", "sst2", "imdb"))
    assert all(c.p_control < 0.05 for c in rows["Avg"][:3]) and rows["Avg"][3].p_control is None
    # ranks on the Avg row only: grad-ellm best; saliency and attention differ by noise -> shared 2nd;
    # the control is never ranked
    assert [c.rank for c in rows["Avg"]] == [2, 1, 2, None]
    assert [c.rank for c in rows["SST2"]] == [None] * 4
    assert rows["Avg"][1].p_next < 0.05 < rows["Avg"][2].p_next  # grad-ellm vs saliency; saliency vs attention
    md = to_markdown(table)
    avg_texts = [c.text for c in rows["Avg"]]
    assert (f"| Avg | {avg_texts[0]}² | **{avg_texts[1]}**¹ | {avg_texts[2]}² | *{avg_texts[3]}* |") in md
    assert "| Dataset | attention | grad-ellm | saliency | random (control) |" in md
    assert "| *AUC π-Soft-NC ↑* | | | | |" in md
    assert "| Dataset | attention | grad-ellm | saliency | 1st vs 2nd |" in md  # the p-value grid
    # the control is whatever the catalog says (AttributionMethod.control), not a name the report knows
    other = paper_tables(Results([tmp_path / "r.sqlite"], datasets=known.datasets), "tiny", tables=known.tables,
                         controls=("saliency",))[0]
    assert other.columns == ["attention", "grad-ellm", "random", "saliency"] and other.control == ("saliency",)
    assert [c.rank for c in dict(other.sections[0].rows)["Avg"]][-1] is None
    sd = statistics.mean(statistics.stdev(values) for values in NS.values())  # NC = 1 - NS: the same spread
    assert (f"Mean Monte-Carlo standard error per example: AUC π-Soft-NS 0.010, SD over examples {sd:.3f}; "
            f"AUC π-Soft-NC 0.030, SD over examples {sd:.3f}.") in md
    p_text = "<0.001" if rows["Avg"][1].p_next < 0.001 else f"{rows['Avg'][1].p_next:.3f}"
    assert f"{p_text} (grad-ellm vs saliency) |" in md
    latex = to_latex(table)
    best_latex = avg_texts[1].replace("±", r"$\pm$")
    assert rf"\textbf{{{best_latex}}}" in latex
    assert r"\textcolor{gray}{random}" in latex and r"AUC $\pi$-Soft-NS $\uparrow$" in latex
    lines = to_csv(table).splitlines()
    assert lines[0] == "table,section,row,column,mean,ci_low,ci_high,n,rank,p_vs_control,p_vs_next"
    est = rows["Avg"][1].estimate
    assert (f"table1_pi_soft_auc,AUC π-Soft-NS ↑,Avg,grad-ellm,{est.mean:.6g},{est.low:.6g},{est.high:.6g},16,1,"
            in to_csv(table))


def test_exact_ties_share_a_rank(tmp_path):
    """Two methods with identical per-example values: p = 1, same rank (the order of labels is no rank)."""
    with Store(tmp_path / "r.sqlite") as store:
        store.check_settings("tiny", {"seed": 0})
        for method in ("a-method", "b-method"):
            for i in range(6):
                store.write(Unit("tiny", "sst2", f"e{i}", method, canonical({})), explanation(method, [0.5] * 4),
                            0.1, [MetricOutput("pi-soft", "dynamic", 0.1, [Row("pi_soft_ns_auc", 0.1 * i),
                                                                          Row("pi_soft_nc_auc", 0.1 * i)])])
    known = catalog()
    table = paper_tables(Results([tmp_path / "r.sqlite"], datasets=known.datasets), "tiny", tables=known.tables,
                         controls=known.controls)[0]
    avg = dict(table.sections[0].rows)["Avg"]
    assert [c.rank for c in avg] == [1, 1] and avg[0].p_next == 1.0 and table.control == ()


def test_report_is_deterministic_and_keeps_timings_apart(tmp_path):
    fill(tmp_path / "a.sqlite", seconds=0.5)
    fill(tmp_path / "b.sqlite", seconds=0.7)  # same results, other wall times
    _, first = build_report([tmp_path / "a.sqlite"], tmp_path / "ra", parse_formats("all"), catalog=catalog())
    _, second = build_report([tmp_path / "b.sqlite"], tmp_path / "rb", parse_formats("all"), catalog=catalog())
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
    assert "0.500 ± 0.000" in (tmp_path / "ra" / "table6_time.md").read_text()
    assert "- examples (n) = IMDb 8, SST2 8" in md and "null" not in md
    assert "mean over n = 8 examples per method, band = 95% bootstrap interval" in md
    page = (tmp_path / "ra" / "report.html").read_text()
    assert page.count("data:image/png;base64,") == 3 and 'class="rank1"' in page and 'class="bars"' in page
    assert '<td class="control">' in page and "p-values</summary>" in page


def test_top_tokens_marks_top_ten_percent():
    expl = json.loads(explanation("grad-ellm", [0.2, 0.9, 0.2, 0.0]))  # the report reads stored JSON
    assert top_tokens(expl) == {1}  # ceil(10% of 4) = 1 token
    assert top_tokens(expl, fraction=0.5) == {0, 1}  # tie at 0.2 broken by position


def test_bad_input():
    with pytest.raises(LlmattrError, match="valid: md, latex, csv, html, all"):
        parse_formats("md,pdf")


def test_empty_store_is_refused(tmp_path):
    Store(tmp_path / "e.sqlite").close()
    with pytest.raises(LlmattrError, match="no finished examples"):
        build_report([tmp_path / "e.sqlite"], tmp_path / "out", catalog=catalog())


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
    known = catalog()
    spec = next(f for f in known.figures if f.kind == "layer_sweep")
    figures = layer_sweep(Results([tmp_path / "r.sqlite"], known.method_defaults), "tiny", tmp_path, known, spec)
    assert [f.path.name for f in figures] == ["fig5_layers_grad-ellm.png"]
    assert "mean over n = 1 examples, error bars = 95% bootstrap interval" in figures[0].caption


def test_a_method_has_one_colour_in_every_figure_and_the_html(tmp_path, monkeypatch):
    import llmattr.report.figures as figures
    from llmattr.plotting import method_colors

    fill(tmp_path / "r.sqlite")
    seen, draw = [], figures.plot_pi_curves
    monkeypatch.setattr(figures, "plot_pi_curves",
                        lambda results, path, title=None, colors=None: seen.append(colors) or draw(results, path,
                                                                                                    title, colors))
    build_report([tmp_path / "r.sqlite"], tmp_path / "out", parse_formats("html"), catalog=catalog())
    colors = method_colors(["random", "attention", "grad-ellm", "saliency"])
    assert list(colors) == ["attention", "grad-ellm", "random", "saliency"] and len(set(colors.values())) == 4
    assert len(seen) == 2 and all(c == colors for c in seen)  # both datasets' pi-curves
    page = (tmp_path / "out" / "report.html").read_text()
    for label, color in colors.items():
        assert f'<i style="background:{color}"></i>{label}' in page  # the qualitative examples' legend


def test_pi_curve_title_names_the_dataset_and_the_model_apart(tmp_path, monkeypatch):
    """A model folder named like the task (``sst2``) must not read as the dataset twice ("SST2, sst2")."""
    from matplotlib.figure import Figure

    fill(tmp_path / "r.sqlite", model="sst2")
    titles, save = [], Figure.savefig
    monkeypatch.setattr(Figure, "savefig", lambda fig, *a, **k: titles.append(fig.get_suptitle()) or save(fig, *a, **k))
    build_report([tmp_path / "r.sqlite"], tmp_path / "out", parse_formats("md"), catalog=catalog())
    assert {"SST2, model sst2, dynamic routing (n = 8)", "IMDb, model sst2, dynamic routing (n = 8)"} <= set(titles)


def test_report_prints_accuracy_and_table_1_rendered_at_80_columns(tmp_path):
    """Issue 51 item 5: ``llmattr report`` prints the accuracy table and Table 1, rendered by rich (no markdown
    pipes), every line within 80 columns, then where the files went."""
    import shutil

    from typer.testing import CliRunner

    from llmattr.cli import app

    store = tmp_path / "r.sqlite"
    shutil.copy("tests/data/report_store.sqlite", store)
    result = CliRunner().invoke(app, ["report", str(store), "--out", str(tmp_path / "rep"), "--format", "md"],
                                env={"COLUMNS": "80", "NO_COLOR": "1"})
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert "Task accuracy of the model" in lines[0] and any("Table 1: AUC of π-Soft-NC/NS" in line for line in lines)
    assert not any(line.startswith("|") for line in lines) and all(len(line) <= 80 for line in lines)
    assert any("0.493 ± 0.032¹" in line for line in lines) and any(line.startswith("wrote ") for line in lines[-3:])


def test_a_table_without_any_p_value_says_why_instead_of_a_grid_of_dashes(tmp_path):
    """n = 1 (or the control alone): no p-value grid of dashes, one line saying why."""
    path = tmp_path / "one.sqlite"
    with Store(path) as store:
        store.check_settings("tiny", {"seed": 0})
        store.write(Unit("tiny", "sst2", "ex-1", "random", "{}"), "{}", 0.1,
                    [MetricOutput("soft", "dynamic", 0.1, [Row("soft_ns", 0.2), Row("soft_nc", 0.4)])])
    results = Results([path], catalog().method_defaults)
    known = catalog()
    table = next(t for t in paper_tables(results, "tiny", 200, tables=known.tables, controls=known.controls)
                 if t.name == "table2_soft")
    assert table.tests is None and "No p-values: a paired test needs two methods" in to_markdown(table)
    assert "p-values." not in to_markdown(table)
