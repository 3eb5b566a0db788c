"""The metric registry: a metric is one registration, and evaluate (API, loop, CLI) and the report find it."""

from __future__ import annotations

import sqlite3

import pytest
from typer.testing import CliRunner

import llmattr
from llmattr.api import catalog
from llmattr.cli import app
from llmattr.declarations import MetricRow, TableSpec
from llmattr.evaluation import EvalConfig, run
from llmattr.faithfulness import METRICS, Metric, MetricResult, register
from llmattr.report import build_report
from llmattr.store import Row


def top_share(ctx, routing: str) -> list[Row]:
    """Share of the first step's retain probability on its highest-scored token (hand-checkable)."""
    scores = ctx.explanation.steps[0].scores
    return [Row("top_share", max(scores) / sum(scores))]


@pytest.fixture
def toy_metric():
    """A metric registered by a test, the way a new metric module registers itself."""
    metric = register(Metric("top-share", top_share, summary="share of the top token",
                             tables=(TableSpec("table_top_share", "Top-token share", "A toy metric.",
                                               "datasets_by_methods", (MetricRow("top_share", "Top share", True),),
                                               order=90),)))
    yield metric
    METRICS.pop("top-share")


def test_a_registered_metric_is_evaluated_stored_and_reported(tiny_llama, tmp_path, toy_metric, monkeypatch):
    expl = llmattr.explain("a good film", model=tiny_llama, method="random", task="sentiment")
    result = llmattr.evaluate(expl, tiny_llama, metrics=["top-share"])
    assert isinstance(result, MetricResult)
    scores = expl.steps[0].scores
    assert result.to_dict() == {"top-share": {"top_share": max(scores) / sum(scores)}}

    out = tmp_path / "r.sqlite"
    monkeypatch.setattr("llmattr.evaluation.loop.load_model", lambda *args, **kwargs: tiny_llama)
    cli = CliRunner().invoke(app, ["evaluate", "--datasets", "sst2", "--methods", "random,attention", "--metrics",
                                   "top-share", "--n", "2", "--out", str(out), "--quiet"])
    assert cli.exit_code == 0, cli.output
    with sqlite3.connect(out) as conn:
        stored = conn.execute("SELECT count(*) FROM results WHERE metric = 'top_share'").fetchone()[0]
    assert stored == 4  # 2 examples x 2 methods
    report = CliRunner().invoke(app, ["report", str(out), "--out", str(tmp_path / "rep"), "--format", "md"])
    assert report.exit_code == 0, report.output
    text = (tmp_path / "rep" / "report.md").read_text()
    assert "### Top-token share" in text and "Top share ↑" in text


def test_alignment_runs_from_evaluate_on_blimp(tiny_llama, tmp_path):
    """Alignment needs gold evidence: the BLiMP datasets carry it, so `evaluate --metrics alignment` works
    there, its rows equal the metric function's, and the report has its table."""
    from llmattr.faithfulness.alignment import explanation_alignment

    cfg = EvalConfig(datasets=["blimp-darn"], methods=["random"], metrics=["alignment"], n=2,
                     out=str(tmp_path / "a.sqlite"))
    summary = run(cfg, lm=tiny_llama, progress=False)
    assert summary.computed == 2 and not summary.failed
    with sqlite3.connect(cfg.out) as conn:
        text = conn.execute("SELECT explanation FROM explanations ORDER BY example LIMIT 1").fetchone()[0]
        ap = conn.execute("SELECT value FROM results WHERE metric = 'average_precision' ORDER BY example "
                          "LIMIT 1").fetchone()[0]
    assert ap == explanation_alignment(llmattr.Explanation.from_json(text)).average_precision[0]
    _, written = build_report([cfg.out], tmp_path / "rep", ("md",), catalog=catalog())
    assert "Alignment with gold evidence" in (tmp_path / "rep" / "report.md").read_text()


def test_alignment_without_evidence_is_one_clear_error(tiny_llama):
    expl = llmattr.explain("a good film", model=tiny_llama, method="random", task="sentiment")
    with pytest.raises(llmattr.LlmattrError, match="no gold evidence"):
        llmattr.evaluate(expl, tiny_llama, metrics=["alignment"])


def test_soft_outputs_and_registered_metrics_mix_in_one_call(tiny_llama):
    """``pi-soft-nc`` is an output of the registered ``pi-soft`` metric, so it mixes with any other metric:
    the mixed call's soft part equals the soft call alone, and its ranking rows equal the ranking call alone."""
    from llmattr.faithfulness import OUTPUTS, SoftResult, select

    expl = llmattr.explain("a good film", model=tiny_llama, method="random", task="sentiment")
    both = llmattr.evaluate(expl, tiny_llama, metrics=["pi-soft-nc", "deletion-insertion"], samples=2, pis=(0.5,))
    assert isinstance(both, MetricResult) and set(both.to_dict()) == {"pi-soft", "deletion-insertion"}
    alone = llmattr.evaluate(expl, tiny_llama, metrics=["pi-soft-nc"], samples=2, pis=(0.5,))
    assert isinstance(alone, SoftResult) and alone.pi_soft_ns is None
    assert both["pi-soft"].to_dict() == alone.to_dict()
    ranking = llmattr.evaluate(expl, tiny_llama, metrics=["deletion-insertion"])
    assert both["deletion-insertion"] == ranking["deletion-insertion"]
    assert [OUTPUTS[name] for name in ("pi-soft-nc", "pi-soft-ns", "soft-nc", "soft-ns")] == ["pi-soft"] * 4
    assert [(m.name, asked) for m, asked in select(["soft-nc", "pi-soft-ns", "log-odds"]).items()] == [
        ("pi-soft", ("soft-nc", "pi-soft-ns")), ("log-odds", ())]
    with pytest.raises(llmattr.LlmattrError, match="unknown option pis"):  # pis is the soft metrics' keyword
        llmattr.evaluate(expl, tiny_llama, metrics=["deletion-insertion"], pis=(0.5,))
    with pytest.raises(llmattr.LlmattrError, match="'pi-soft-nc' are already registered"):
        register(Metric("other", top_share, outputs=("pi-soft-nc",)))
    assert "other" not in METRICS


def test_a_plugin_written_before_the_declarations_were_named_so_still_imports_them():
    """``llmattr.specs`` was the declarations' module before issue 39 (docs/evaluate.md showed plugins importing
    from it): its names are the declarations' own classes."""
    import llmattr.declarations as declarations
    import llmattr.specs as old

    assert all(getattr(old, name) is getattr(declarations, name) for name in old.__all__)
    assert {"MetricRow", "TableSpec", "FigureSpec"} <= set(old.__all__)
