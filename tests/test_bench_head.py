"""benchmarks/bench_head.py (paper 003's Table 2): one command on a ``finetune --head`` folder across lengths prints
seconds per instance for NormXLogit and the gradient methods with each method's same-run ratio to NormXLogit."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import build_tiny
from test_finetune import toy_file
from test_finetune_head import head_finetune

ROOT = Path(__file__).resolve().parents[1]


def test_bench_head_runs_across_lengths_on_a_tiny_head_and_prints_same_run_ratios(tiny_tokenizer, tmp_path):
    head_finetune(build_tiny("llama", tiny_tokenizer), tmp_path / "ft", toy_file(tmp_path / "toy.jsonl"), epochs=1)
    out = tmp_path / "t2.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    bench = [sys.executable, str(ROOT / "benchmarks" / "bench_head.py")]
    result = subprocess.run([*bench, "--model", str(tmp_path / "ft"), "--lengths", "8,24", "--repeats", "2",
                             "--out", str(out)], capture_output=True, text=True, env=env, timeout=600)
    assert result.returncode == 0, result.stderr
    lines = [line for line in result.stdout.splitlines() if line.startswith("| ")]
    assert lines[0].startswith("| input length | Gradient Norm | Gradient x Input | Integrated Gradients | NormXLogit")
    assert "Integrated Gradients / NormXLogit" in lines[0] and "load average" in result.stdout
    saved = json.loads(out.read_text())
    assert list(saved["rows"]) == ["8", "24"]
    for length, cells in saved["rows"].items():
        ratios = saved["ratios"][length]
        for method, (mean, sd) in cells.items():
            assert mean > 0 and sd >= 0
            assert ratios[method] == pytest.approx(mean / cells["normxlogit"][0], rel=1e-12)
        assert ratios["normxlogit"] == 1.0
        row = next(line for line in lines if line.startswith(f"| {length} |")).strip("| ").split(" | ")
        assert row[-4:] == [f"{ratios[m]:.2f}x" for m in ("saliency", "input-x-gradient", "integrated-gradients",
                                                          "normxlogit")]
    refused = subprocess.run([*bench, "--model", "x", "--methods", "saliency"], capture_output=True, text=True,
                             env=env, timeout=600)
    assert refused.returncode == 2 and "must include normxlogit" in refused.stderr
