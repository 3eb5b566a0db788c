"""The CLI refuses bad output paths and option values before the model loads: one line, exit 2, nothing
written or stored. Each case also names a model that does not exist, so an error about the option (not
about the model) proves the check ran first."""

import json
import subprocess
import sys

import pytest

from conftest import foreign_sqlite

NO_MODEL = ["--model", "/nonexistent/model.gguf"]


def run_cli(*args, timeout=600):  # generous: CLI starts take long on a loaded machine
    return subprocess.run([sys.executable, "-m", "llmattr", *args], capture_output=True, text=True, timeout=timeout)


def one_line_error(result, fragment):
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 2 and len(lines) == 1 and fragment in lines[0], result.stderr
    assert "model file not found" not in lines[0]


@pytest.mark.parametrize("args, fragment", [
    (["--json", "{tmp}/ok.json", "--html", "{tmp}/missing/x.html"], "does not exist"),
    (["--json", "{tmp}/ok.json", "--evaluate", "--plot", "{tmp}"], "is a folder"),
    (["--evaluate", "--plot", "{tmp}/curve.gif"], "ending in .png, .svg, .pdf"),
    (["--figure", "{tmp}/m.txt"], "ending in .png, .svg, .pdf"),
    (["--evaluate", "--samples", "-1", "--json", "{tmp}/ok.json"], "--samples must be at least 1"),
    (["--evaluate", "--routing", "foo", "--json", "{tmp}/ok.json"], "unknown --routing 'foo'"),
    (["--field", "foo=bar"], "unknown --field 'foo'"),
    (["--format", "yaml"], "unknown --format 'yaml'"),
    (["--shots", "1", "--shots-from", "{tmp}/missing.jsonl"], "file not found"),
    (["--method", "saliency", "--objective", "contrast"], "give --foil WORD"),
    (["--method", "lime", "--foil", "Negative"], "--foil needs a contrastive objective"),
    (["--objective", "prob"], "unknown grad-ellm objective 'prob'"),
    (["--target", "free"], "target must be one of label, generated, gold"),
    (["--scope", "content"], "scope must be one of span, prompt, all"),
    (["--checkpointing", "sometimes"], "checkpointing must be one of auto, on, off"),
    (["--method", "attention", "--objective", "logit"], "method attention scores no model output"),
    (["--dtype", "int8"], "unknown dtype 'int8'"),
    (["--json", "/proc/version"], "--json /proc/version cannot be written"),
    (["--html", "/sys/llmattr.html"], "--html /sys/llmattr.html cannot be written"),
])
def test_explain_refuses_before_the_model_loads(args, fragment, tmp_path):
    result = run_cli("explain", "A fine film.", *NO_MODEL, *(a.format(tmp=tmp_path) for a in args))
    one_line_error(result, fragment)
    assert list(tmp_path.iterdir()) == []  # nothing written


@pytest.mark.parametrize("args, fragment", [
    (["--samples", "-2"], "--samples must be at least 1"),
    (["--step-stride", "0"], "--step-stride must be at least 1"),
    (["--n", "0"], "--n must be at least 1"),
    (["--max-memory", "gpu=2GB"], "max-memory 'gpu=2GB' is not device=size"),
    (["--dtype", "half-ish"], "unknown dtype 'half-ish'"),
    (["--out", "{tmp}/missing/dir/r.sqlite"], "folder {tmp}/missing/dir does not exist"),
    (["--out", "/proc/llmattr.sqlite"], "--out /proc/llmattr.sqlite cannot be written"),
    (["--metrics", "data-randomization", "--permuted-model", "{tmp}/none"], "--permuted-model: model path not found"),
    (["--metrics", "data-randomization", "--permuted-model", "/proc"], "--permuted-model: /proc is not a model fold"),
    (["--metrics", "reliability", "--reliability-of", "log-odds,nope"], "--reliability-of: unknown metric 'nope'"),
])
def test_evaluate_refuses_bad_values_and_stores_nothing(args, fragment, tmp_path):
    result = run_cli("evaluate", *NO_MODEL, "--out", str(tmp_path / "r.sqlite"),
                     *(a.format(tmp=tmp_path) for a in args))
    one_line_error(result, fragment.format(tmp=tmp_path))
    assert list(tmp_path.iterdir()) == []


def test_evaluate_with_a_model_that_cannot_load_leaves_no_store(tmp_path):
    result = run_cli("evaluate", *NO_MODEL, "--out", str(tmp_path / "r.sqlite"), "--n", "1", "--quiet")
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 2 and len(lines) == 1 and "model.gguf" in lines[0], result.stderr
    assert list(tmp_path.iterdir()) == []  # the docs' promise: a refused run writes nothing


def test_evaluate_refuses_a_foreign_sqlite_file_byte_identical(tmp_path):
    path = foreign_sqlite(tmp_path / "app.db")
    before = path.read_bytes()
    result = run_cli("evaluate", *NO_MODEL, "--out", str(path))
    one_line_error(result, "SQLite database of another program")
    assert path.read_bytes() == before and [p.name for p in tmp_path.iterdir()] == ["app.db"]


def test_version_and_methods_json():
    from llmattr import __version__, methods

    result = run_cli("--version")
    assert result.returncode == 0 and result.stdout.strip() == f"llmattr {__version__}"
    result = run_cli("methods", "--json")
    records = json.loads(result.stdout)
    assert [r["name"] for r in records] == methods.available()
    assert all(r["signed"] == methods.REGISTRY[r["name"]].signed for r in records)
