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
    """``{(dataset, label): {example: {pi: value}}}``, each value the mean over generation steps."""
    acc: dict = defaultdict(lambda: defaultdict(lambda: defaultdict(list)))
    for dataset, method, params, example, pi, _step, value, _se in results.values(model, metric, routing):
        acc[(dataset, results.label(method, params))][example][pi].append(value)
    return {key: {ex: {pi: mean(v) for pi, v in points.items()} for ex, points in examples.items()}
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
    """``{(dataset, label): {pi: {example: value}}}`` for curve metrics (rows with pi != -1)."""
    out: dict = {}
    for key, examples in per_example(results, model, metric, routing).items():
        by_pi: dict = defaultdict(dict)
        for example, points in examples.items():
            for pi, value in points.items():
                if pi != NONE:
                    by_pi[pi][example] = value
        if by_pi:
            out[key] = dict(sorted(by_pi.items()))
    return out


def stored_mc_se(results: Results, model: str, metric: str, routing: str) -> dict[tuple, list[float]]:
    """``{(dataset, label): [Monte-Carlo standard error of each example]}`` of a scalar metric as stored (the
    stored ``mc_se`` of its rows; metrics without one are absent)."""
    out: dict = defaultdict(list)
    for dataset, method, params, _example, pi, _step, _value, se in results.values(model, metric, routing):
        if se is not None and pi == NONE:
            out[(dataset, results.label(method, params))].append(se)
    return dict(out)


def layer_values(results: Results, model: str, metric: str, routing: str) -> tuple[dict[tuple, dict], list[int]]:
    """``{(layer, label): {dataset: {example: value}}}`` of a per-layer metric (the stored ``pi`` is the layer
    number) and the sorted layers; a method stored without layers (``pi`` = -1: Random) is repeated at each."""
    by_pi = per_example(results, model, metric, routing)
    layers = sorted({int(pi) for examples in by_pi.values() for points in examples.values() for pi in points
                     if pi != NONE})
    out: dict = defaultdict(lambda: defaultdict(dict))
    for (dataset, label), examples in by_pi.items():
        for example, points in examples.items():
            for pi, value in points.items():
                for layer in layers if pi == NONE else [int(pi)]:
                    out[(layer, label)][dataset][example] = value
    return {key: dict(strata) for key, strata in out.items()}, layers
