"""The report's store queries: per-example values of a metric per (dataset, method label), from merged stores.

A per-example value is the mean over its generation steps (and, for curve metrics summarised by one number, over
the curve's points), summed with :func:`math.fsum` so the result does not depend on the order rows were written in
(shards, resumed runs).
"""

from __future__ import annotations

import math
from collections import defaultdict

from ..store import NONE, Results


def mean(values: list[float]) -> float:
    return math.fsum(values) / len(values)


def per_example(results: Results, model: str, metric: str, routing: str) -> dict[tuple, dict[str, dict]]:
    """``{(dataset, label): {example: {x: value}}}`` (``x`` the stored x), each value the mean over generation
    steps."""
    acc: dict = defaultdict(lambda: defaultdict(lambda: defaultdict(list)))
    for dataset, method, params, example, x, _step, value, _se in results.values(model, metric, routing):
        acc[(dataset, results.label(method, params))][example][x].append(value)
    return {key: {ex: {x: mean(v) for x, v in points.items()} for ex, points in examples.items()}
            for key, examples in acc.items()}


def example_values(results: Results, model: str, metric: str, routing: str) -> dict[tuple, dict[str, float]]:
    """``{(dataset, label): {example: value}}``: each example's value (mean over its curve points)."""
    return {key: {ex: mean(list(points.values())) for ex, points in examples.items()}
            for key, examples in per_example(results, model, metric, routing).items()}


def scalar_means(results: Results, model: str, metric: str, routing: str) -> dict[tuple, float]:
    """``{(dataset, label): mean over examples}`` of each example's value (mean over its curve points)."""
    return {key: mean(list(examples.values()))
            for key, examples in example_values(results, model, metric, routing).items()}


def curve_values(results: Results, model: str, metric: str, routing: str) -> dict[tuple, dict[float, dict]]:
    """``{(dataset, label): {x: {example: value}}}`` for curve metrics (rows with x != -1)."""
    out: dict = {}
    for key, examples in per_example(results, model, metric, routing).items():
        by_x: dict = defaultdict(dict)
        for example, points in examples.items():
            for x, value in points.items():
                if x != NONE:
                    by_x[x][example] = value
        if by_x:
            out[key] = dict(sorted(by_x.items()))
    return out


def stored_mc_se(results: Results, model: str, metric: str, routing: str) -> dict[tuple, list[float]]:
    """``{(dataset, label): [Monte-Carlo standard error of each example]}`` of a scalar metric as stored (the
    stored ``mc_se`` of its rows; metrics without one are absent)."""
    out: dict = defaultdict(list)
    for dataset, method, params, _example, x, _step, _value, se in results.values(model, metric, routing):
        if se is not None and x == NONE:
            out[(dataset, results.label(method, params))].append(se)
    return dict(out)


def layer_values(results: Results, model: str, metric: str, routing: str) -> tuple[dict[tuple, dict], list[int]]:
    """``{(layer, label): {dataset: {example: value}}}`` of a per-layer metric (the stored ``x`` is the layer
    number) and the sorted layers; a method stored without layers (``x`` = -1: Random) is repeated at each."""
    by_x = per_example(results, model, metric, routing)
    layers = sorted({int(x) for examples in by_x.values() for points in examples.values() for x in points
                     if x != NONE})
    out: dict = defaultdict(lambda: defaultdict(dict))
    for (dataset, label), examples in by_x.items():
        for example, points in examples.items():
            for x, value in points.items():
                for layer in layers if x == NONE else [int(x)]:
                    out[(layer, label)][dataset][example] = value
    return {key: dict(strata) for key, strata in out.items()}, layers
