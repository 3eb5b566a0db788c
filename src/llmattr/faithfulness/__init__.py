"""Faithfulness metrics on any Explanation; every module here registers its metrics (:mod:`.registry`).

``llmattr.evaluate(explanation)`` scores an Explanation's retain probabilities with the soft metrics
(pi-Soft-NC/NS, Soft-NC/NS of paper 000) or with any registered metric by its name or its outputs' names;
:func:`target_from_explanation` rebuilds the model input from the Explanation's JSON fields, so scores
computed anywhere can be scored once they are put in an Explanation.
"""

from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass, field

from ..errors import LlmattrError
from ..explanation import Explanation
from ..models.loading import LoadedModel
from ..store import Row
from .engine import PerturbationEngine
from .inputs import check_explanation, example_key, target_from_explanation
from .registry import (
    BUILT_IN,
    METRICS,
    OUTPUTS,
    Metric,
    MetricContext,
    MetricOptions,
    Option,
    check_needs,
    declared_options,
    figure_specs,
    get_metrics,
    metric_needs,
    register,
    select,
    source_metrics,
    table_specs,
    unregister,
)
from .soft import PI_GRID, SoftResult

for _module in pkgutil.iter_modules(__path__):  # every metric module registers itself
    if not _module.name.startswith("_") and _module.name not in ("registry", "inputs", "engine"):
        importlib.import_module(f"{__name__}.{_module.name}")


@dataclass
class MetricResult:
    """What ``llmattr.evaluate`` gives for several metrics: the store rows of each (``{metric: [Row, ...]}``)
    and the own result object of those that have one (``{metric: SoftResult}``)."""

    rows: dict[str, list[Row]] = field(default_factory=dict)
    results: dict[str, object] = field(default_factory=dict)

    def __getitem__(self, metric: str):
        return self.results[metric] if metric in self.results else self.rows[metric]

    def to_dict(self) -> dict:
        """``{metric: {value name: value or [(x or step, value), ...]}}``; a metric's own result as its
        ``to_dict()``."""
        out: dict = {name: result.to_dict() for name, result in self.results.items()}
        for metric, rows in self.rows.items():
            values: dict = {}
            for row in rows:
                x = row.x if row.x is not None else row.step
                if x is None:
                    values[row.metric] = row.value
                else:
                    values.setdefault(row.metric, []).append((x, row.value))
            out[metric] = values
        return out


def evaluate(explanation: Explanation, lm: LoadedModel, metrics=("pi-soft-nc", "pi-soft-ns"),
             routing: str = "dynamic", **options) -> SoftResult | MetricResult:
    """Score an Explanation with the registered metrics ``metrics``: metric names (``llmattr.faithfulness.METRICS``:
    ``pi-soft``, ``soft``, ``deletion-insertion``, ``alignment``, ...) or their outputs' names (``pi-soft-nc``,
    ``pi-soft-ns``, ``soft-nc``, ``soft-ns``: parts of ``pi-soft``), mixed freely.

    ``options``: the seed, the options the metrics declare (:class:`~.registry.Option`: samples, step_stride,
    coupling, removal, ...; :func:`declared_options`) and the asked metrics' ``keywords`` (the soft metrics': pis,
    mode, scope, batch_size; :func:`~.soft.evaluate_explanation`). One metric with its own result object (the soft
    metrics': a :class:`SoftResult`) gives that object; otherwise a :class:`MetricResult` holds every asked metric's
    rows or result."""
    names = [metrics] if isinstance(metrics, str) else list(metrics)
    check_explanation(explanation)
    chosen = select(names)
    keywords = {key for metric in chosen for key in metric.keywords}
    declared = declared_options()
    valid = [*BUILT_IN, *sorted(declared), *sorted(keywords)]
    unknown = sorted(set(options) - set(valid))
    if unknown:
        raise LlmattrError(f"unknown option {', '.join(unknown)}; valid: {', '.join(valid)}")
    values = {name: declared[name].check(value) for name, value in options.items() if name in declared}
    check_needs([metric.name for metric in chosen], values, metric_needs())
    ctx = MetricContext(lm, explanation, MetricOptions(**{k: v for k, v in options.items() if k in BUILT_IN},
                                                       values=values),
                        keywords={k: v for k, v in options.items() if k in keywords})
    parts = {metric: metric.evaluate(ctx, routing, outputs) for metric, outputs in chosen.items()}
    if len(parts) == 1 and next(iter(parts)).result is not None:
        return next(iter(parts.values()))
    return MetricResult({m.name: part for m, part in parts.items() if m.result is None},
                        {m.name: part for m, part in parts.items() if m.result is not None})


__all__ = ["BUILT_IN", "METRICS", "OUTPUTS", "PI_GRID", "Metric", "MetricContext", "MetricOptions", "MetricResult",
           "Option", "PerturbationEngine", "SoftResult", "declared_options", "evaluate", "example_key", "figure_specs",
           "get_metrics", "metric_needs", "register", "select", "source_metrics", "table_specs",
           "target_from_explanation", "unregister"]
