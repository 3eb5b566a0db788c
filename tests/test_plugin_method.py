"""Adding a method is one file (issue 49 item 5): a plugin's module, written here into a folder that holds it as an
installed distribution (a ``.dist-info`` with its ``llmattr.plugins`` entry point), is found by ``llmattr explain
--help``, refused in one line for a bad value of its parameter, both without torch, and runs, with no step between
writing the file and using it (no regeneration, no golden to edit). docs/plugins.md tells the same."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import build_tiny
from test_cli_fast import run_cli

TOY = '''"""A toy attribution method: 1 on every k-th token of the span (k: its one parameter, ``every``)."""

from llmattr.lazy import torch  # imported when attribute() first runs, so --help and refusals load no torch
from llmattr.methods import COUNT, AttributionMethod, register


@register
class EveryKth(AttributionMethod):
    """1 on span tokens 0, k, 2k, ..., 0 elsewhere, at every explained step."""

    name = "every-kth"
    family = "toy"
    summary = "1 on every k-th token of the span"
    needs_gradients = False
    signed = False
    cost = "no pass"
    defaults = {"every": 2}
    rules = {"every": COUNT}

    def attribute(self, lm, target):
        a, b = target.span
        scores = (torch.arange(b - a) % self.params["every"] == 0).double()
        return scores.expand(target.n_steps, b - a).clone()
'''

@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """A folder on ``PYTHONPATH`` holding the plugin's one module and the metadata pip writes for it."""
    site = tmp_path_factory.mktemp("site")
    (site / "every_kth.py").write_text(TOY, encoding="utf-8")
    info = site / "every_kth-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: every-kth\nVersion: 0.1\n", encoding="utf-8")
    (info / "entry_points.txt").write_text("[llmattr.plugins]\nevery-kth = every_kth\n", encoding="utf-8")
    return site


def llmattr(site: Path, *args: str) -> tuple[str, int, list[str], str]:
    """``llmattr ARGS`` in a fresh interpreter with the plugin installed: (stdout, exit code, heavy modules, stderr)."""
    return run_cli(list(args), site=site, columns=250, timeout=300)


def test_the_plugin_is_on_the_help_without_torch(installed):
    out, code, heavy, _ = llmattr(installed, "explain", "--help")
    assert code == 0 and heavy == []
    assert "--every" in out and "Method parameter every (default: every-kth 2)." in out
    out, code, _, _ = llmattr(installed, "methods")
    assert code == 0 and "every-kth" in out and "1 on every k-th token of the span" in out


def test_a_bad_value_is_refused_in_one_line_without_torch(installed):
    _, code, heavy, err = llmattr(installed, "explain", "a fine film", "--method", "every-kth", "--every", "0")
    assert (code, heavy) == (2, [])
    assert err.strip() == "error: every-kth every must be a positive integer"
    _, code, heavy, err = llmattr(installed, "evaluate", "--methods", "every-kth:every=x", "--n", "1")
    assert (code, heavy) == (2, [])
    assert err.strip() == "error: every-kth every must be a positive integer"


def test_the_plugin_explains(installed, tmp_path, tiny_tokenizer):
    folder = tmp_path / "tiny"
    build_tiny("llama", tiny_tokenizer).model.save_pretrained(folder)
    tiny_tokenizer.save_pretrained(folder)
    out, code, heavy, err = llmattr(installed, "explain", "a fine film", "--method", "every-kth", "--every", "3",
                                    "--model", str(folder), "--format", "json", "--max-new-tokens", "2",
                                    "--target", "generated")
    assert code == 0, err
    assert "torch" in heavy  # it ran the model
    data = json.loads(out)
    a, b = data["span"]
    assert data["method"] == "every-kth" and data["params"] == {"every": 3}
    assert [step["raw"] for step in data["steps"]] == [[1.0 if i % 3 == 0 else 0.0 for i in range(b - a)]] * 2
