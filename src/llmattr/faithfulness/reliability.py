"""Reliability of the faithfulness metrics: MetaQuantus's two criteria (Hedström et al. 2023), adapted to LLMs.

A metric should keep its verdict under perturbations that must not change it (**noise resilience**) and move when
the explanation is disrupted (**adversarial reactivity**). For one Explanation with scores ``(raw, s)`` (raw scores,
retain probabilities) the ``reliability`` metric evaluates each metric of ``--reliability-of`` on the explanation
itself and on four perturbed copies (:func:`perturbed`):

minor (the verdict must not move)
    ``seed``: the same scores under another Monte-Carlo seed (the run's seed + 1; deterministic metrics cannot move);
    ``power``: the monotone transform ``s -> s**c``, ``raw -> sign(raw) |raw|**c`` (``c`` = ``--reliability-power``,
    2 by default), which keeps every ranking and which pi-Soft claims to ignore (paper 000 eq. 7: ``alpha`` absorbs
    ``c``);
disruptive (the verdict must move)
    ``shuffle``: the scores moved to other tokens (one seeded permutation of the span, the same at every step);
    ``invert``: ``s -> 1 - s``, ``raw -> -raw`` (the ranking reversed).

Rows, per value ``v`` of the metric's report tables (a value is the mean of its rows, over curve points and steps,
as the report reads it): ``v|none`` (the value on the explanation) and ``v|<perturbation>`` = the perturbed value
minus it, ``Delta``, with the Monte-Carlo standard error of that difference where the metric reports one: of the
paired draws where both were drawn from the same uniforms (every perturbation but ``seed``; :func:`shift_error`).
The report (:mod:`llmattr.report.trust`) turns them into resilience (``E|Delta|`` under the minor perturbations)
and reactivity (``E|Delta|`` under the disruptive ones), both in units of the value's standard deviation over the
run's examples, and adds the agreement of the metrics' rankings of the methods (Kendall's tau) and their split-half
stability.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import replace

import numpy as np

from ..declarations import DISRUPTIVE, MINOR, PERTURBED_SEP, RETAIN_RULE, UNPERTURBED
from ..errors import LlmattrError
from ..explanation import Explanation
from ..lazy import torch
from ..stats import mc_standard_error, stable_seed
from ..store import Row
from .inputs import example_key
from .ranking import REMOVAL
from .registry import METRICS, NO_ROUTING, Metric, MetricContext, MetricOptions, Option, metric_list, register
from .soft import SOFT_OPTIONS

PERTURBATIONS = (*MINOR, *DISRUPTIVE)
POWER = Option("reliability_power", 2.0, "Reliability: c of the monotone transform s -> s**c")
ROUTING = "dynamic"  # the routing the measured metrics run under


def power(x: torch.Tensor, c: float) -> torch.Tensor:
    """``sign(x) |x|**c``: monotone increasing for ``c > 0`` (``s**c`` on retain probabilities)."""
    return x.sign() * x.abs().pow(c)


def perturbed(expl: Explanation, kind: str, c: float = POWER.default, seed: int = 0) -> Explanation:
    """A copy of ``expl`` with its scores perturbed by ``kind`` (module docstring); ``seed`` draws the shuffle."""
    if kind not in PERTURBATIONS:
        raise LlmattrError(f"unknown perturbation {kind!r}; valid: {', '.join(PERTURBATIONS)}")
    raw, s = expl.score_matrix(raw=True), expl.score_matrix()
    if kind == "power":
        raw, s = power(raw, c), s.pow(c)
    elif kind == "invert":
        raw, s = -raw, 1 - s
    elif kind == "shuffle":
        order = torch.randperm(s.shape[1], generator=torch.Generator().manual_seed(seed))
        raw, s = raw[:, order], s[:, order]
    steps = [replace(step, raw=r, scores=p) for step, r, p in zip(expl.steps, raw.tolist(), s.tolist(), strict=True)]
    return replace(expl, steps=steps)


RELIABILITY_OF = Option("reliability_of", "pi-soft,soft,comp-suff,log-odds,deletion-insertion",
                        "Reliability: the metrics (comma-separated) whose resilience and reactivity are measured",
                        lists_metrics=True)


def measured(names: str) -> list[Metric]:
    """The registered metrics named in ``names`` (comma-separated); unknown ones list the valid ones."""
    return [METRICS[n] for n in metric_list(names, RELIABILITY_OF.listable(), RELIABILITY_OF.flag)]


def table_values(metric: Metric) -> tuple[str, ...]:
    """The stored value names of ``metric``'s report tables (each once, in order)."""
    return tuple(dict.fromkeys(row.metric for table in metric.tables for row in table.rows))


def values_of(rows: list[Row], names: tuple[str, ...]) -> dict[str, Row]:
    """``{name: Row}``: each name's mean over its rows (curve points, steps), with its Monte-Carlo standard error
    and draws where it is one scalar row that has them."""
    grouped: dict[str, list[Row]] = defaultdict(list)
    for row in rows:
        if row.metric in names:
            grouped[row.metric].append(row)
    return {name: group[0] if len(group) == 1 else Row(name, math.fsum(r.value for r in group) / len(group))
            for name, group in grouped.items()}


def shift_error(base: Row, other: Row, paired: bool) -> float | None:
    """The Monte-Carlo standard error of ``other.value - base.value``: with ``paired`` draws (the same uniforms,
    sample j of one beside sample j of the other) the standard error of the paired differences, which common
    random numbers make far smaller than the two errors combined; otherwise (another seed: independent draws)
    ``sqrt(se_base**2 + se_other**2)``. None where either has no error (a deterministic metric)."""
    if base.se is None or other.se is None:
        return None
    if paired and base.draws is not None and other.draws is not None:
        return float(mc_standard_error(np.subtract(other.draws, base.draws)))
    return math.hypot(base.se, other.se)


def perturbed_contexts(ctx: MetricContext, c: float) -> dict[str, MetricContext]:
    """One context per perturbation (:func:`perturbed`; ``seed``: the run's seed + 1), each with its own memo, so
    the metrics measured on it share their passes there as on ``ctx`` (the ranking metrics' one ranking pass)."""
    seed = ctx.options.seed
    shuffle_seed = stable_seed(seed, example_key(ctx.explanation), "shuffle", bits=31)
    return {kind: MetricContext(ctx.lm, perturbed(ctx.explanation, kind, c, shuffle_seed),
                                MetricOptions(seed + 1 if kind == "seed" else seed, ctx.options.values))
            for kind in PERTURBATIONS}


def reliability_rows(ctx: MetricContext, metrics: list[Metric], c: float) -> list[Row]:
    """``v|none`` and ``v|<perturbation>`` (perturbed minus unperturbed, with the MC error of the difference) for
    every table value ``v`` of every metric in ``metrics``."""
    others = perturbed_contexts(ctx, c)
    rows = []
    for metric in metrics:
        routing = ROUTING if metric.routed else NO_ROUTING
        names = table_values(metric)
        base = values_of(metric.compute(ctx, routing), names)  # ctx's memo: shared with the run's own metrics
        rows += [Row(f"{name}{PERTURBED_SEP}{UNPERTURBED}", row.value, se=row.se) for name, row in base.items()]
        for kind, other in others.items():
            for name, row in values_of(metric.compute(other, routing), names).items():
                if name in base:
                    rows.append(Row(f"{name}{PERTURBED_SEP}{kind}", row.value - base[name].value,
                                    se=shift_error(base[name], row, paired=kind != "seed")))
    return rows


def _rows(ctx: MetricContext, routing: str) -> list[Row]:
    return reliability_rows(ctx, measured(ctx.options.get(RELIABILITY_OF.name)), float(ctx.options.get(POWER.name)))


register(Metric(
    "reliability", _rows, options=("seed",), declares=(RELIABILITY_OF, POWER, *SOFT_OPTIONS, REMOVAL),
    rules=(RETAIN_RULE,),
    summary="metric reliability: resilience to minor and reactivity to disruptive score perturbations "
            "(MetaQuantus, Hedström et al. 2023); the report's trust section"))
