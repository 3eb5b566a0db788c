"""Reliability of metrics (llmattr.faithfulness.reliability): resilience and reactivity known by construction."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import llmattr
from llmattr.declarations import MetricRow, TableSpec
from llmattr.errors import LlmattrError
from llmattr.faithfulness import Metric, MetricContext, MetricOptions, ranking, register, unregister
from llmattr.faithfulness.inputs import example_key
from llmattr.faithfulness.registry import METRICS
from llmattr.faithfulness.reliability import (
    PERTURBATIONS,
    RELIABILITY_OF,
    measured,
    perturbed,
    power,
    reliability_rows,
    shift_error,
)
from llmattr.stats import stable_seed
from llmattr.store import Row

TEXT = "a fine good film with a dull end"


@pytest.fixture
def first_token_metric():
    """A toy metric whose value is the first token's retain probability ``s_0`` (and its raw score ``r_0``)."""
    metric = register(Metric(
        "toy-first", lambda ctx, routing: [Row("first_s", ctx.explanation.steps[0].scores[0]),
                                           Row("first_raw", ctx.explanation.steps[0].raw[0])],
        tables=(TableSpec("toy_first", "toy", "", "methods_by_datasets",
                          (MetricRow("first_s", "s0", True), MetricRow("first_raw", "r0", True))),)))
    yield metric
    unregister(metric.name)


def scored(lm, values):
    return llmattr.from_scores(TEXT, torch.tensor(values, dtype=torch.float64), model=lm, task="sentiment")


def rows_by_name(rows):
    return {row.metric: row.value for row in rows}


def test_perturbations_by_hand():
    x = torch.tensor([-2.0, 0.5, 3.0])
    assert power(x, 2.0).tolist() == [-4.0, 0.25, 9.0]  # monotone: the order is kept


def test_toy_metric_moves_exactly_as_its_formula_says(tiny_llama, first_token_metric):
    m = len(llmattr.tokens(TEXT, model=tiny_llama, task="sentiment"))
    raw = torch.linspace(0.1, 0.9, m)
    expl = scored(tiny_llama, raw.tolist())
    s0, r0 = expl.steps[0].scores[0], expl.steps[0].raw[0]
    ctx = MetricContext(tiny_llama, expl, MetricOptions(seed=4))
    got = rows_by_name(reliability_rows(ctx, [first_token_metric], c=3.0))
    order = torch.randperm(m, generator=torch.Generator().manual_seed(
        stable_seed(4, example_key(expl), "shuffle", bits=31)))
    s, r = expl.score_matrix()[0], expl.score_matrix(raw=True)[0]
    assert got["first_s|none"] == s0 and got["first_raw|none"] == r0
    assert got["first_s|seed"] == 0.0  # the metric draws nothing: another seed cannot move it
    assert got["first_s|power"] == pytest.approx(s0 ** 3 - s0)
    assert got["first_raw|power"] == pytest.approx(r0 ** 3 - r0)
    assert got["first_s|invert"] == pytest.approx(1 - 2 * s0)
    assert got["first_raw|invert"] == pytest.approx(-2 * r0)
    assert got["first_s|shuffle"] == pytest.approx(float(s[order[0]]) - s0)
    assert got["first_raw|shuffle"] == pytest.approx(float(r[order[0]]) - r0)


def test_rank_metrics_are_resilient_by_construction(tiny_llama):
    m = len(llmattr.tokens(TEXT, model=tiny_llama, task="sentiment"))
    expl = scored(tiny_llama, torch.linspace(-1, 2, m).tolist())
    ctx = MetricContext(tiny_llama, expl, MetricOptions(seed=0))
    got = rows_by_name(reliability_rows(ctx, measured("comp-suff,log-odds,deletion-insertion"), c=2.0))
    minor = {name: v for name, v in got.items() if name.endswith(("|seed", "|power"))}
    assert len(minor) == 2 * 9 and set(minor.values()) == {0.0}  # deterministic, and ranks unchanged by s**c
    assert any(v != 0 for name, v in got.items() if name.endswith("|invert"))  # reversing the ranking moves them


def test_ranking_metrics_share_one_ranking_pass_per_perturbation(tiny_llama, monkeypatch):
    """comp-suff, log-odds and deletion-insertion read one ranking pass of each explanation (the context's memo):
    the unperturbed one and one per perturbation, five in all, not five per metric."""
    calls = []
    real = ranking.ranking_metrics
    monkeypatch.setattr(ranking, "ranking_metrics", lambda *a, **k: calls.append(1) or real(*a, **k))
    m = len(llmattr.tokens(TEXT, model=tiny_llama, task="sentiment"))
    ctx = MetricContext(tiny_llama, scored(tiny_llama, torch.linspace(-1, 2, m).tolist()), MetricOptions(seed=0))
    reliability_rows(ctx, measured("comp-suff,log-odds,deletion-insertion"), c=2.0)
    assert len(calls) == 1 + len(PERTURBATIONS)


def test_pi_soft_absorbs_the_power_that_moves_soft(tiny_llama):
    """Paper 000's claim by construction: s**c is undone by alpha (same coupled masks), alpha = 1 is not. The
    retain probabilities are min-max's, with an exact 0 and an exact 1 (issue 48: the clip of earlier versions
    let those escape the invariance)."""
    m = len(llmattr.tokens(TEXT, model=tiny_llama, task="sentiment"))
    raw = torch.linspace(0.15, 0.85, m)[torch.randperm(m, generator=torch.Generator().manual_seed(1))].double()
    expl = scored(tiny_llama, raw.tolist())
    s = torch.tensor(expl.steps[0].scores, dtype=torch.float64)
    assert {0.0, 1.0} <= set(s.tolist())
    ctx = MetricContext(tiny_llama, expl, MetricOptions(seed=0, values={"samples": 3}))
    got = rows_by_name(reliability_rows(ctx, measured("pi-soft,soft"), c=2.0))
    assert got["pi_soft_ns_auc|power"] == pytest.approx(0, abs=1e-12)  # the same masks: the same values
    assert got["pi_soft_nc_auc|power"] == pytest.approx(0, abs=1e-12)
    assert got["expected_retained|power"] == pytest.approx(float((s ** 2).sum() - s.sum()), rel=1e-9)
    assert abs(got["soft_ns|power"]) > 1e-3 and abs(got["soft_nc|power"]) > 1e-3


@pytest.mark.slow
def test_pi_soft_shift_under_a_power_is_zero_on_the_embedded_model(smollm):
    """The reliability metric's s**c shift of pi-Soft is 0 to float precision on the embedded model, for a real
    method's min-max scores (exact 0s and 1s included)."""
    expl = llmattr.explain("A gorgeous, witty, seductive movie.", model=smollm, method="saliency")
    ctx = MetricContext(smollm, expl, MetricOptions(seed=0, values={"samples": 3}))
    got = rows_by_name(reliability_rows(ctx, measured("pi-soft"), c=2.0))
    assert abs(got["pi_soft_ns_auc|power"]) <= 1e-12 and abs(got["pi_soft_nc_auc|power"]) <= 1e-12


def test_shift_error_pairs_draws_of_the_same_uniforms():
    base = Row("v", 0.5, se=0.1, draws=[0.4, 0.5, 0.6])
    other = Row("v", 0.6, se=0.1, draws=[0.52, 0.58, 0.7])
    assert shift_error(base, other, paired=True) == pytest.approx(
        float(np.std([0.12, 0.08, 0.1], ddof=1) / np.sqrt(3)))
    assert shift_error(base, other, paired=False) == pytest.approx(math.hypot(0.1, 0.1))
    assert shift_error(Row("v", 1.0), other, paired=True) is None  # deterministic: no error


def test_soft_draws_average_to_their_values_and_pair_across_perturbations(tiny_llama):
    """The draws' mean is the value (each sample's Soft and AUC averaged over steps), and the stored error of a
    shift under s**c is the paired one: the standard error of the per-sample differences."""
    m = len(llmattr.tokens(TEXT, model=tiny_llama, task="sentiment"))
    expl = scored(tiny_llama, torch.linspace(-1, 2, m).tolist())
    ctx = MetricContext(tiny_llama, expl, MetricOptions(seed=0, values={"samples": 4}))
    base = {row.metric: row for row in METRICS["soft"].compute(ctx, "dynamic") + METRICS["pi-soft"].compute(
        ctx, "dynamic") if row.draws is not None}
    assert set(base) == {"soft_ns", "soft_nc", "pi_soft_ns_auc", "pi_soft_nc_auc"}
    for row in base.values():
        assert len(row.draws) == 4 and np.mean(row.draws) == pytest.approx(row.value, rel=1e-9, abs=1e-12)
        assert row.se == pytest.approx(float(np.std(row.draws, ddof=1) / 2), rel=1e-9)
    other = MetricContext(tiny_llama, perturbed(expl, "power", 2.0), ctx.options)
    powered = {row.metric: row for row in METRICS["soft"].compute(other, "dynamic")}
    got = {row.metric: row for row in reliability_rows(ctx, measured("soft"), c=2.0)}
    expected = np.std(np.subtract(powered["soft_ns"].draws, base["soft_ns"].draws), ddof=1) / 2
    assert got["soft_ns|power"].se == pytest.approx(float(expected), rel=1e-9)


def test_unknown_measured_metric_is_one_line():
    with pytest.raises(LlmattrError, match="--reliability-of: unknown metric 'nope'"):
        measured("pi-soft,nope")
    with pytest.raises(LlmattrError, match="unknown perturbation"):
        perturbed(None, "flip")


def test_reliability_of_check_hook_refuses_unknown_metrics():
    with pytest.raises(LlmattrError, match="--reliability-of: unknown metric 'nope'"):
        RELIABILITY_OF.check("log-odds,nope")
    assert RELIABILITY_OF.check("log-odds,pi-soft") == "log-odds,pi-soft"
