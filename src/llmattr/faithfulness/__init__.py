"""Faithfulness metrics on any Explanation; every module here registers its metrics (:mod:`.registry`).

``llmattr.evaluate(explanation)`` scores an Explanation's retain probabilities with the soft metrics
(pi-Soft-NC/NS, Soft-NC/NS of paper 000) or with any registered metric by name;
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
from . import soft
from .engine import PerturbationEngine
from .inputs import example_key, target_from_explanation
from .registry import METRICS, Metric, MetricContext, MetricOptions, get_metrics, register, table_specs
from .soft import PI_GRID, SoftResult

for _module in pkgutil.iter_modules(__path__):  # every metric module registers itself
    if not _module.name.startswith("_") and _module.name not in ("registry", "inputs", "engine"):
        importlib.import_module(f"{__name__}.{_module.name}")


@dataclass
class MetricResult:
    """The rows of registered metrics for one Explanation (``{metric: [Row, ...]}``)."""

    rows: dict[str, list[Row]] = field(default_factory=dict)

    def to_dict(self) -> dict:
        """``{metric: {value name: value or [(pi or step, value), ...]}}``."""
        out: dict = {}
        for metric, rows in self.rows.items():
            values: dict = {}
            for row in rows:
                x = row.pi if row.pi is not None else row.step
                if x is None:
                    values[row.metric] = row.value
                else:
                    values.setdefault(row.metric, []).append((x, row.value))
            out[metric] = values
        return out


def evaluate(explanation: Explanation, lm: LoadedModel, metrics=("pi-soft-nc", "pi-soft-ns"),
             routing: str = "dynamic", **options) -> SoftResult | MetricResult:
    """Score an Explanation: the soft metric names (``pi-soft-nc``, ``pi-soft-ns``, ``soft-nc``,
    ``soft-ns``) give a :class:`SoftResult` (:func:`llmattr.faithfulness.soft.evaluate_explanation`
    documents the options); registered metric names (``llmattr methods``-style list in
    ``llmattr.faithfulness.METRICS``, e.g. ``deletion-insertion``, ``alignment``) give a
    :class:`MetricResult` with their store rows, computed with :class:`MetricOptions` ``options``."""
    names = [metrics] if isinstance(metrics, str) else list(metrics)
    if all(name in soft.METRICS for name in names):
        return soft.evaluate_explanation(explanation, lm, metrics=names, routing=routing, **options)
    if not isinstance(explanation, Explanation):
        raise LlmattrError(f"evaluate() takes an Explanation (llmattr.explain's result), got "
                           f"{type(explanation).__name__}")
    unknown = sorted(set(options) - set(MetricOptions.__dataclass_fields__))
    if unknown:
        raise LlmattrError(f"unknown option {', '.join(unknown)}; valid: "
                           f"{', '.join(MetricOptions.__dataclass_fields__)}")
    ctx = MetricContext(lm, explanation, MetricOptions(**options))
    return MetricResult({m.name: m.compute(ctx, routing if m.routed else "none") for m in get_metrics(names)})


__all__ = ["METRICS", "PI_GRID", "Metric", "MetricContext", "MetricOptions", "MetricResult", "PerturbationEngine",
           "SoftResult", "evaluate", "example_key", "get_metrics", "register", "table_specs",
           "target_from_explanation"]
