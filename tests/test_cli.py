"""CLI: user errors print one line and exit 2; explain writes JSON and HTML."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import token_methods
from llmattr import methods


def run_cli(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "llmattr", *args], capture_output=True, text=True,
                          timeout=timeout)


@pytest.mark.parametrize("args, fragment", [
    (["explain", "   "], "empty text"),
    (["explain", "fine", "--method", "no-such-method"], "unknown method"),
    (["explain", "fine", "--task", "no-such-task"], "unknown task"),
    (["explain", "fine", "--model", "/nonexistent/x.gguf"], "model file not found"),
    (["evaluate", "--coupling", "shared"], "--coupling must be one of coupled, independent; got 'shared'"),
    (["report", "none.sqlite", "--bootstrap", "0"], "--bootstrap must be at least 1"),
])
def test_user_errors_exit_2_with_one_line(args, fragment):
    result = run_cli(*args)
    assert result.returncode == 2, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and fragment in lines[0], result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.slow
def test_too_long_text_exits_2():
    result = run_cli("explain", "word " * 9000)
    assert result.returncode == 2 and "too long" in result.stderr


@pytest.mark.slow
def test_explain_sentiment_json_and_html(tmp_path):
    out, page, curve = tmp_path / "out.json", tmp_path / "out.html", tmp_path / "curve.png"
    result = run_cli("explain", "An engrossing film that is never boring.", "--task", "sentiment",
                     "--json", str(out), "--html", str(page), "--evaluate", "--samples", "1", "--plot", str(curve))
    assert result.returncode == 0, result.stderr
    data = json.loads(out.read_text())
    a, b = data["span"]
    assert "".join(data["tokens"][a:b]).strip() == "An engrossing film that is never boring."
    step = data["steps"][0]
    assert step["token"].strip() in ("Positive", "Negative")
    assert len(step["scores"]) == b - a and all(0.0 <= s <= 1.0 for s in step["scores"])
    assert step["token"] in result.stdout
    metrics = data["metrics"]
    for name in ("pi_soft_ns", "pi_soft_nc"):
        assert len(metrics[name]["x"]) == len(metrics[name]["values"]) == 19
        assert 0 <= metrics[name]["auc"] <= 2
    assert {"soft_ns", "soft_nc", "expected_retained"} <= set(metrics)
    assert data["routing"] == "dynamic" and data["samples"] == 1 and data["seed"] == 0
    assert "AUC pi-Soft-NS" in result.stdout and curve.read_bytes()[:4] == b"\x89PNG"
    html = page.read_text()
    assert html.count('class="tok"') == b - a and "title=\"score" in html


CHEAP = {"integrated-gradients": ["n_steps=2"], "igcg": ["n_steps=2"], "aieg": ["n_steps=2"],
         "gradient-shap": ["n_samples=2"], "lime": ["n_samples=8"], "reagent": ["max_probe_steps=1", "num_probes=1"]}


@pytest.mark.slow
def test_cli_explains_with_every_method(smollm, tmp_path, monkeypatch):
    """`llmattr explain --method NAME` for every registered method, on a sentiment prompt and a 10-token
    generation of the embedded model (in-process, the model loaded once)."""
    from typer.testing import CliRunner

    from llmattr.cli import app

    monkeypatch.setattr("llmattr.models.loading.load_model", lambda *args, **kwargs: smollm)
    runner = CliRunner()
    for name in token_methods():  # the source-level ones: tests/test_sources.py
        params = [arg for p in CHEAP.get(name, []) for arg in ("--param", p)]
        for task in (["--task", "sentiment"], ["--task", "generate", "--answer", " a b c d e f g h i j"]):
            out = tmp_path / f"{name}.json"
            result = runner.invoke(app, ["explain", "A gorgeous, witty film.", "--method", name, *task, *params,
                                         "--json", str(out)])
            assert result.exit_code == 0, (name, task, result.output)
            data = json.loads(out.read_text())
            n_span = data["span"][1] - data["span"][0]
            assert data["method"] == name and len(data["steps"]) == (1 if task[1] == "sentiment" else 10), name
            assert all(len(s["scores"]) == n_span and all(0 <= x <= 1 for x in s["scores"]) for s in data["steps"])


def test_readme_method_list_names_every_registered_method():
    """The README's "Methods (`llmattr methods`)" paragraph lists what `llmattr methods` lists."""
    readme = (Path(__file__).parents[1] / "README.md").read_text(encoding="utf-8")
    listed = re.search(r"Methods \(`llmattr methods`\):(.*?)Metrics:", readme, re.S).group(1)
    assert set(re.findall(r"`([a-z0-9-]+)`", listed)) == set(methods.available())
