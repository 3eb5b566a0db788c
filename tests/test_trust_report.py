"""The report's trust section (llmattr.report.trust): Kendall's tau against scipy, verdicts, split-half stability
known by construction, and one run through evaluate + report."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats as sps

from llmattr.api import catalog
from llmattr.evaluation import EvalConfig, run
from llmattr.report import build_report
from llmattr.report.model import Cell, Stats
from llmattr.report.trust import SPLITS, agreement, method_matrix, split_half, tau_b, verdict
from llmattr.stats import Estimate


@pytest.mark.parametrize("seed", range(5))
def test_tau_b_agrees_with_scipy(seed):
    rng = np.random.default_rng(seed)
    x, y = rng.integers(0, 4, 7).astype(float), rng.integers(0, 4, 7).astype(float)  # ties on purpose
    assert tau_b(x, y) == pytest.approx(sps.kendalltau(x, y).statistic, abs=1e-12)
    batch = tau_b(np.stack([x, y]), np.stack([y, y]))
    assert batch[1] == pytest.approx(1.0) and batch[0] == pytest.approx(tau_b(x, y))
    assert np.isnan(tau_b(np.ones(3), x[:3]))


def test_verdict_reads_the_interval_against_the_threshold():
    def cell(mean, low, high):
        return Cell(mean, "", estimate=Estimate(mean, low, high, 10))

    assert verdict([cell(0.9, 0.6, 1.0)]) == "fails"  # whole interval above 0.5
    assert verdict([cell(0.6, 0.4, 0.8)]) == "passes"  # the interval reaches below 0.5: not shown unchanged
    assert verdict([cell(0.2, 0.1, 0.3), cell(0.95, 0.9, 1.0)]) == "fails"  # either check failing fails
    assert verdict([Cell(None, "–")]) == "–"


def test_split_half_and_agreement_known_by_construction():
    """Methods separated by offsets far above the example noise rank the same in every half and in every
    value: tau = 1; a value that reverses them has tau = -1 with it."""
    rng = np.random.default_rng(0)
    labels = ["a", "b", "c", "d"]
    base = {("ds", label): {f"e{i}": 10.0 * k + rng.normal() * 0.01 for i in range(12)}
            for k, label in enumerate(labels)}
    reverse = {key: {ex: -v for ex, v in examples.items()} for key, examples in base.items()}
    matrix, keys = method_matrix(base, labels)
    assert matrix.shape == (4, 12) and len(keys) == 12
    cell = split_half(matrix, keys, True, Stats())
    assert cell.value == 1.0 and cell.estimate.low == 1.0 and cell.estimate.n == 12
    cells = agreement({"v": (matrix, keys), "w": method_matrix(reverse, labels), "u": (matrix, keys)},
                      {"v": True, "w": True, "u": True}, Stats())
    assert cells["v"].value == pytest.approx(0.0)  # tau 1 with u, -1 with w
    assert cells["w"].value == pytest.approx(-1.0)
    noisy = {key: {ex: rng.normal() for ex in examples} for key, examples in base.items()}
    noise = split_half(*method_matrix(noisy, labels), True, Stats())
    # pure noise: no stable ranking (the two halves of one sample are even anti-correlated around its mean)
    assert noise.value < 0.5 and noise.estimate.low < 0 and SPLITS == 200


def test_evaluate_and_report_give_the_trust_section(tiny_llama, tmp_path, shared_data):
    out = tmp_path / "r.sqlite"
    cfg = EvalConfig(datasets=["sst2"], methods=["saliency", "random"], n=3, out=str(out),
                     metrics=["model-randomization", "reliability"], reliability_of="log-odds")
    summary = run(cfg, lm=tiny_llama, progress=False)
    assert summary.computed == 6 and not summary.failed
    _, written = build_report([out], tmp_path / "report", ("md", "html"), catalog=catalog())
    md = (tmp_path / "report" / "report.md").read_text()
    assert "Sanity checks of the methods" in md and "Reliability of the metrics" in md
    assert "| random | 1.000 ± 0.000 | 1.000 ± 0.000 | 1.000 ± 0.000 | – | fails |" in md  # random must fail
    log_odds = next(line for line in md.splitlines() if line.startswith("| Log-odds ↓"))
    assert log_odds.split(" | ")[1:3] == ["0.00 ± 0.00", "0.00 ± 0.00"]  # deterministic, rank-based: resilient
    assert "Reliability of the metrics" in (tmp_path / "report" / "report.html").read_text()
