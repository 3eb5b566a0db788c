"""The extension cost (docs/architecture.md): a method, a metric or a task is one registration in one file, and
``llmattr explain``, ``evaluate``, ``report`` and the CLI help find it. Each toy plugin here is defined in this
file only and registered by a fixture (removed again after its test); the CLI derives its options from the
registries when a command is built, so a plugin registered before the command runs is on its help and its
command line."""

from __future__ import annotations

import json
import sqlite3

import pytest
import torch
from typer.testing import CliRunner

from llmattr import methods
from llmattr.cli import app
from llmattr.methods import AttributionMethod

WIDE = {"COLUMNS": "250"}  # rich help in one line per option


class ToySweep(AttributionMethod):
    """Scores 1, 2, ..., m along the span, times ``weight`` and the number of layers read (``depth``)."""

    name = "toy-sweep"
    family = "toy"
    summary = "position x weight x depth (a test's own method)"
    needs_gradients = False
    signed = False
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
