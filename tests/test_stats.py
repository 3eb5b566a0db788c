"""llmattr.stats on simulated data with known answers: CI coverage, test size and power, Holm, ranks."""

from __future__ import annotations

import math

import numpy as np
import pytest

from llmattr.stats import estimate, holm, mc_standard_error, paired_test, significance_ranks

REPLICATIONS = 500


def strata(*groups) -> dict:
    return {f"d{i}": {f"e{j}": float(v) for j, v in enumerate(g)} for i, g in enumerate(groups)}


def test_ci_covers_known_mean_95_percent():
    """Beta(2, 5) examples (bounded, skewed like per-example AUCs), n = 50: 93-97% coverage of 2/7."""
    rng = np.random.default_rng(0)
    truth = 2 / 7
    covered = 0
    for rep in range(REPLICATIONS):
        est = estimate(strata(rng.beta(2, 5, size=50)), n_resamples=2000, seed=rep)
        covered += est.low <= truth <= est.high
    assert 0.93 <= covered / REPLICATIONS <= 0.97


def test_avg_row_ci_resamples_within_datasets():
    """Two datasets with far-apart means: the stratified interval of the mean of means covers 93-97%
    (a pooled bootstrap would mix the datasets and cover almost always)."""
    rng = np.random.default_rng(5)
    truth = (0.2 + 0.8) / 2
    covered, widths = 0, []
    for rep in range(REPLICATIONS):
        est = estimate(strata(rng.normal(0.2, 0.1, 25), rng.normal(0.8, 0.1, 35)), seed=rep)
        covered += est.low <= truth <= est.high
        widths.append(est.high - est.low)
    assert 0.93 <= covered / REPLICATIONS <= 0.97
    # width ~ 2 * 1.96 * SE of the mean of two means, SE = 0.5 * sqrt(0.1^2/25 + 0.1^2/35)
    se = 0.5 * math.sqrt(0.01 / 25 + 0.01 / 35)
    assert np.median(widths) == pytest.approx(2 * 1.96 * se, rel=0.1)


def test_estimate_mean_n_and_degenerate_cases():
    est = estimate(strata([0.1, 0.3], [1.0, 2.0, 3.0]))
    assert est.mean == pytest.approx((0.2 + 2.0) / 2) and est.n == 5
    assert est.low < est.mean < est.high
    assert estimate(strata([0.4, 0.4, 0.4])) == estimate(strata([0.4, 0.4, 0.4]))
    flat = estimate(strata([0.4, 0.4, 0.4]))
    assert flat.low == flat.high == pytest.approx(0.4) and flat.half_width == 0
    one = estimate(strata([0.7]))
    assert one.mean == 0.7 and one.low is None and one.half_width is None and one.n == 1
    assert estimate(strata(np.arange(10.0)), seed=3) == estimate(strata(np.arange(10.0)), seed=3)  # seeded


def test_paired_test_size_and_power():
    """Null (paired values differ by symmetric noise around a shared example effect): p < 0.05 in ~5%
    of replications; a planted mean difference of 0.6 SD of the differences at n = 30: power > 80%."""
    rng = np.random.default_rng(7)
    n, rejected, detected = 30, 0, 0
    for rep in range(REPLICATIONS):
        example = rng.normal(0.5, 0.2, n)  # example-to-example spread, shared by both methods
        a, b = example + rng.normal(0, 0.05, n), example + rng.normal(0, 0.05, n)
        rejected += paired_test(strata(a), strata(b), n_resamples=999, seed=rep) < 0.05
        planted = a + 0.6 * 0.05 * math.sqrt(2)
        detected += paired_test(strata(planted), strata(b), n_resamples=999, seed=rep) < 0.05
    assert 0.025 <= rejected / REPLICATIONS <= 0.075
    assert detected / REPLICATIONS > 0.8


def test_paired_test_pairs_by_example_and_weights_datasets():
    a = strata([1.0, 2.0, 3.0, 4.0, 5.0, 6.0])
    b = {"d0": {"e0": 1.0, "e1": 2.0, "e2": 3.0, "e3": 4.0, "e4": 5.0, "e5": 6.0, "extra": 99.0}}
    assert paired_test(a, b) == 1.0  # the example only b holds is not a pair; identical pairs: p = 1
    assert paired_test(a, strata([0.0])) is None  # one pair
    # exact sign-flip test, n = 6 (2^6 = 64 flips): all differences +1 -> only the two all-same-sign
    # assignments reach |mean| = 1, p = 2/64
    assert paired_test(a, strata([0.0, 1.0, 2.0, 3.0, 4.0, 5.0])) == pytest.approx(2 / 64)


def test_holm_by_hand():
    # sorted 0.01, 0.02, 0.04 -> 3 * 0.01, 2 * 0.02, max(0.04, 1 * 0.04)
    assert holm([0.04, 0.01, 0.02]) == pytest.approx([0.04, 0.03, 0.04])
    assert holm([0.5, 0.001]) == pytest.approx([0.5, 0.002])
    assert holm([0.4, 0.3]) == pytest.approx([0.6, 0.6])  # 2 * 0.3, then max(0.6, 0.4): monotone
    assert holm([0.6, 0.7]) == pytest.approx([1.0, 1.0])


def test_significance_ranks_share_where_not_significant():
    rng = np.random.default_rng(1)
    base = rng.normal(0, 1, 40)
    cells = {"a": strata(base + 1.0), "b": strata(base + 1.0 + rng.normal(0, 0.01, 40)),
             "c": strata(base), "d": strata(base + rng.normal(0, 0.01, 40))}
    means = {k: estimate(v).mean for k, v in cells.items()}
    ranking = significance_ranks(cells, means, higher=True)
    assert set(ranking.order[:2]) == {"a", "b"} and set(ranking.order[2:]) == {"c", "d"}
    assert ranking.ranks == {"a": 1, "b": 1, "c": 2, "d": 2}  # a ~ b and c ~ d, b >> c
    assert ranking.p_next[1] < 0.05 and ranking.p_next[0] > 0.05 and ranking.p_next[2] > 0.05
    lower = significance_ranks(cells, means, higher=False)
    assert lower.ranks == {"c": 1, "d": 1, "a": 2, "b": 2}


def test_mc_standard_error():
    x = np.array([[1.0, 2.0, 3.0, 4.0], [5.0, 5.0, 5.0, 5.0]])
    assert mc_standard_error(x) == pytest.approx([np.std([1, 2, 3, 4], ddof=1) / 2, 0.0])
    assert np.isnan(mc_standard_error(np.ones((3, 1)))).all()
