"""The extension cost (docs/architecture.md): a method, a metric or a task is one registration in one file, and
``llmattr explain``, ``evaluate``, ``report`` and the CLI help find it. Each toy plugin here is defined in this
file only and registered by a fixture (removed again after its test); the CLI derives its options from the
registries when a command is built, so a plugin registered before the command runs is on its help and its
command line."""

from __future__ import annotations

import json
import sqlite3
from dataclasses import replace

import pytest
import torch
from typer.testing import CliRunner

import llmattr
from llmattr import methods
from llmattr.cli import app
from llmattr.declarations import FigureSpec, MetricRow
from llmattr.faithfulness import Metric, Option, register, unregister
from llmattr.methods import AttributionMethod
from llmattr.store import Row
from llmattr.tasks import TASKS, get_task, register_task

WIDE = {"COLUMNS": "250"}  # rich help in one line per option


class ToySweep(AttributionMethod):
    """Scores 1, 2, ..., m along the span, times ``weight`` and the number of layers read (``depth``)."""

    name = "toy-sweep"
    family = "toy"
    summary = "position x weight x depth (a test's own method)"
    needs_gradients = signed = False
    cost = "no pass"
    defaults = {"depth": "all", "weight": 1.0}
    layer_sweep = "depth"

    def attribute(self, lm, target) -> torch.Tensor:
        a, b = target.span
        depth = lm.model.config.num_hidden_layers if self.params["depth"] == "all" else int(self.params["depth"])
        positions = torch.arange(1, b - a + 1, dtype=torch.float64)
        return (positions * float(self.params["weight"]) * depth).expand(target.n_steps, b - a).clone()


@pytest.fixture
def toy_method():
    yield methods.register(ToySweep)
    methods.REGISTRY.pop(ToySweep.name)


def test_a_method_with_a_layer_sweep_and_its_own_parameter(toy_method, tiny_llama, tmp_path, monkeypatch):
    runner = CliRunner()
    help_text = runner.invoke(app, ["explain", "--help"], env=WIDE).output
    assert "--weight" in help_text and "Method parameter weight (default: toy-sweep 1.0)" in help_text
    assert "toy-sweep" in runner.invoke(app, ["methods", "--json"]).output

    monkeypatch.setattr("llmattr.models.loading.load_model", lambda *args, **kwargs: tiny_llama)
    shown = runner.invoke(app, ["explain", "a good film", "--method", "toy-sweep", "--weight", "2", "--depth", "1",
                                "--format", "json"])
    assert shown.exit_code == 0, shown.output
    data = json.loads(shown.stdout)
    a, b = data["span"]
    assert data["params"] == {"depth": 1, "weight": 2}
    assert data["steps"][0]["raw"] == [2.0 * k for k in range(1, b - a + 1)]  # weight 2 x depth 1 x position
    refused = runner.invoke(app, ["explain", "a good film", "--method", "random", "--weight", "2"])
    assert "method random has no parameter weight" in str(refused.exception)  # main() prints it, exit 2

    out = tmp_path / "r.sqlite"
    monkeypatch.setattr("llmattr.evaluation.loop.load_model", lambda *args, **kwargs: tiny_llama)
    run = runner.invoke(app, ["evaluate", "--datasets", "sst2", "--methods", "toy-sweep,random", "--layers", "1,all",
                              "--metrics", "pi-soft", "--samples", "1", "--n", "2", "--out", str(out), "--quiet"])
    assert run.exit_code == 0, run.output
    with sqlite3.connect(out) as conn:
        stored = {json.loads(p)["depth"] for (p,) in conn.execute(
            "SELECT DISTINCT params FROM explanations WHERE method = 'toy-sweep'")}
    assert stored == {1, "all"}  # --layers swept the method's own layer_sweep parameter
    report = runner.invoke(app, ["report", str(out), "--out", str(tmp_path / "rep"), "--format", "md"])
    assert report.exit_code == 0, report.output
    text = (tmp_path / "rep" / "report.md").read_text()
    assert "toy-sweep:depth=1" in text and "fig5_layers_toy-sweep.png" in text
    assert (tmp_path / "rep" / "fig5_layers_toy-sweep.png").read_bytes()[:4] == b"\x89PNG"


def toy_curve_rows(ctx, routing: str) -> list[Row]:
    """``mean(step 0's retain probabilities) * x ** power`` at x = 0.25, 0.5, 1 (hand-checkable)."""
    scores = ctx.explanation.steps[0].scores
    power = ctx.options.get("power")
    return [Row("toy_curve", sum(scores) / len(scores) * x ** power, x=x) for x in XS]


XS = (0.25, 0.5, 1.0)


@pytest.fixture
def toy_metric():
    metric = register(Metric(
        "toy-curve", toy_curve_rows, summary="a test's own curve metric",
        declares=(Option("power", 1.0, "Toy curve: the exponent of x"),),
        figures=(FigureSpec("fig_toy_curve", "Toy curve", "The toy curve against x on", (MetricRow(
            "toy_curve", "toy value", True),), xlabel="x"),)))
    yield metric
    unregister(metric.name)


def test_a_metric_with_an_option_and_a_figure(toy_metric, tiny_llama, tmp_path, monkeypatch):
    runner = CliRunner()
    help_text = runner.invoke(app, ["evaluate", "--help"], env=WIDE).output
    assert "--power" in help_text and "Toy curve: the exponent of x (default 1.0)" in help_text
    assert "toy-curve" in help_text  # --metrics names every registered metric

    expl = llmattr.explain("a good film", model=tiny_llama, method="random", task="sentiment")
    mean = sum(expl.steps[0].scores) / len(expl.steps[0].scores)
    result = llmattr.evaluate(expl, tiny_llama, metrics=["toy-curve"], power=3)
    xs, values = zip(*result.to_dict()["toy-curve"]["toy_curve"], strict=True)
    assert xs == XS and values == pytest.approx([mean * x ** 3 for x in XS])
    with pytest.raises(llmattr.LlmattrError, match="--power must be a number"):
        llmattr.evaluate(expl, tiny_llama, metrics=["toy-curve"], power="high")

    out = tmp_path / "r.sqlite"
    monkeypatch.setattr("llmattr.evaluation.loop.load_model", lambda *args, **kwargs: tiny_llama)
    run = runner.invoke(app, ["evaluate", "--datasets", "sst2", "--methods", "random,attention", "--metrics",
                              "toy-curve", "--power", "2", "--n", "2", "--out", str(out), "--quiet"])
    assert run.exit_code == 0, run.output
    with sqlite3.connect(out) as conn:
        settings = json.loads(conn.execute("SELECT settings FROM settings").fetchone()[0])
        rows = conn.execute("SELECT r.x, r.value, e.explanation FROM results r JOIN explanations e USING "
                            "(model, dataset, example, method, params) WHERE r.metric = 'toy_curve'").fetchall()
    assert settings["power"] == 2.0 and len(rows) == 2 * 2 * len(XS)
    for x, value, text in rows:  # the option reached the metric: value = mean score * x ** 2
        scores = json.loads(text)["steps"][0]["scores"]
        assert value == pytest.approx(sum(scores) / len(scores) * x ** 2)
    report = runner.invoke(app, ["report", str(out), "--out", str(tmp_path / "rep"), "--format", "md"])
    assert report.exit_code == 0, report.output
    text = (tmp_path / "rep" / "report.md").read_text()
    assert "fig_toy_curve_sst2.png" in text and "The toy curve against x on SST2: mean over n = 2" in text
    assert (tmp_path / "rep" / "fig_toy_curve_sst2.png").read_bytes()[:4] == b"\x89PNG"


@pytest.fixture
def toy_task(tmp_path):
    """A task with its own sample file (its ``data``: a path) and display name."""
    rows = [{"id": f"t{i}", "text": text, "label": label} for i, (text, label) in enumerate(
        [("a good film", "positive"), ("a dull film", "negative"), ("fine acting", "positive"),
         ("weak plot", "negative")])]
    path = tmp_path / "toy-reviews.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    task = register_task(replace(get_task("sst2"), name="toy-reviews", data=str(path), display="Toy Reviews",
                                 report_order=-1, hf={}))
    yield task
    TASKS.pop(task.name)


def test_a_task_with_a_display_name(toy_task, tiny_llama, tmp_path, monkeypatch):
    runner = CliRunner()
    assert "toy-reviews" in runner.invoke(app, ["explain", "--help"], env=WIDE).output
    assert "toy-reviews" in runner.invoke(app, ["evaluate", "--help"], env=WIDE).output

    monkeypatch.setattr("llmattr.models.loading.load_model", lambda *args, **kwargs: tiny_llama)
    shown = runner.invoke(app, ["explain", "a good film", "--task", "toy-reviews", "--method", "random",
                                "--format", "json"])
    assert shown.exit_code == 0, shown.output
    assert json.loads(shown.stdout)["task"] == "toy-reviews"

    out = tmp_path / "r.sqlite"
    monkeypatch.setattr("llmattr.evaluation.loop.load_model", lambda *args, **kwargs: tiny_llama)
    run = runner.invoke(app, ["evaluate", "--datasets", "sst2,toy-reviews", "--methods", "random", "--metrics",
                              "soft", "--samples", "1", "--n", "2", "--out", str(out), "--quiet"])
    assert run.exit_code == 0, run.output
    report = runner.invoke(app, ["report", str(out), "--out", str(tmp_path / "rep"), "--format", "md"])
    assert report.exit_code == 0, report.output
    text = (tmp_path / "rep" / "report.md").read_text()
    assert "| *Toy Reviews* |" in text and "examples (n) = Toy Reviews 2, SST2 2" in text  # report_order -1: first
