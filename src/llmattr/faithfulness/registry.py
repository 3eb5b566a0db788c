"""The metric registry: each metric module registers its :class:`Metric` beside its code.

A :class:`Metric` turns one Explanation into store rows (:class:`~llmattr.store.Row`): ``compute(ctx,
routing)`` with a :class:`MetricContext` (the model, the explanation, the user's options and a memo shared
by the metrics of one explanation). ``options`` names the :class:`MetricOptions` fields that change its
numbers (recorded in a store's settings), ``routed`` whether it is computed once per routing (dynamic /
fixed) or once in all (routing ``none``), and ``tables`` the report tables it feeds
(:class:`~llmattr.specs.TableSpec`). ``outputs`` are further names the Python API accepts for parts of
the metric (``pi-soft-nc`` asks the ``pi-soft`` metric for its NC curve) and ``result`` gives the Python
API's own result object (a :class:`~llmattr.faithfulness.soft.SoftResult`) instead of the rows, taking the
``keywords`` options beyond :class:`MetricOptions`. ``llmattr evaluate --metrics``, ``llmattr.evaluate(expl,
metrics=[...])`` and ``llmattr report`` all read this registry (:func:`select`), so a new metric is one
module that calls :func:`register`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..checks import register_once
from ..errors import LlmattrError
from ..specs import TableSpec
from ..store import Row

if TYPE_CHECKING:  # annotations only: the registry itself loads no model code
    from ..explanation import Explanation
    from ..models.loading import LoadedModel

NO_ROUTING = "none"


@dataclass(frozen=True)
class MetricOptions:
    """The user's settings a metric may read (``llmattr evaluate``'s options of the same names)."""

    samples: int = 15
    seed: int = 0
    step_stride: int = 5
    coupling: str = "coupled"
    removal: str = "zero"


@dataclass
class MetricContext:
    """One explanation being scored: its model, the options, and a memo for results that several metrics
    of this explanation share (e.g. one batched ranking pass for three ranking metrics)."""

    lm: LoadedModel
    explanation: Explanation
    options: MetricOptions = field(default_factory=MetricOptions)
    memo: dict = field(default_factory=dict)
    keywords: dict = field(default_factory=dict)  # the Python API's further options (``Metric.keywords``)

    def shared(self, key: tuple, make: Callable[[], object]):
        """``make()`` once per explanation and ``key``."""
        if key not in self.memo:
            self.memo[key] = make()
        return self.memo[key]


@dataclass(frozen=True)
class Metric:
    """One metric family as ``llmattr evaluate`` runs it (see the module docstring)."""

    name: str
    compute: Callable[[MetricContext, str], list[Row]]
    options: tuple[str, ...] = ()
    routed: bool = False
    summary: str = ""
    tables: tuple[TableSpec, ...] = ()
    outputs: tuple[str, ...] = ()
    result: Callable[[MetricContext, str, tuple[str, ...]], object] | None = None
    keywords: tuple[str, ...] = ()

    def evaluate(self, ctx: MetricContext, routing: str, outputs: tuple[str, ...] = ()) -> object:
        """What ``llmattr.evaluate`` gives for this metric: ``result(ctx, routing, outputs)`` where the metric
        has one, else its store rows; computed once per routing if ``routed``, once in all otherwise."""
        routing = routing if self.routed else NO_ROUTING
        return self.compute(ctx, routing) if self.result is None else self.result(ctx, routing, outputs)

    def routings(self, wanted: tuple[str, ...]) -> tuple[str, ...]:
        """The routings it is computed under for a run asking for ``wanted``."""
        return wanted if self.routed else (NO_ROUTING,)


METRICS: dict[str, Metric] = {}


OUTPUTS: dict[str, str] = {}  # a part's name (``pi-soft-nc``) -> the metric that computes it (``pi-soft``)


def register(metric: Metric) -> Metric:
    """Make ``metric`` available by its name and its outputs' names (a name already taken by another metric or
    output is refused)."""
    taken = [name for name in (metric.name, *metric.outputs)
             if OUTPUTS.get(name, metric.name) != metric.name or (name in METRICS and name != metric.name)]
    if taken:
        raise LlmattrError(f"metric {metric.name!r}: the name(s) {', '.join(map(repr, taken))} are already "
                           f"registered; register it under other names")
    register_once(METRICS, metric.name, metric, "metric")
    OUTPUTS.update(dict.fromkeys(metric.outputs, metric.name))
    return metric


def unregister(name: str) -> None:
    """Remove a metric and its outputs' names (a test's or a notebook's own metric)."""
    METRICS.pop(name)
    for output in [key for key, owner in OUTPUTS.items() if owner == name]:
        del OUTPUTS[output]


def select(names: list[str]) -> dict[Metric, tuple[str, ...]]:
    """The registered metrics that ``names`` (metric or output names) ask for, in order, each with the outputs
    asked of it (``()``: all of it); unknown names list the valid ones."""
    unknown = [name for name in names if name not in METRICS and name not in OUTPUTS]
    if unknown or not names:
        what = f"unknown metric {', '.join(map(repr, unknown))}" if unknown else "no metric given"
        raise LlmattrError(f"{what}; valid: {', '.join(sorted([*METRICS, *OUTPUTS]))}")
    chosen: dict[Metric, tuple[str, ...]] = {}
    for name in names:
        metric = METRICS[OUTPUTS.get(name, name)]
        asked = chosen.get(metric, ())
        chosen[metric] = () if name == metric.name or (metric in chosen and not asked) else (*asked, name)
    return chosen


def get_metrics(names: list[str]) -> list[Metric]:
    """The registered metrics of ``names`` (each once, in order): :func:`select` without the outputs."""
    return list(select(names))


def table_specs() -> tuple[TableSpec, ...]:
    """Every registered metric's report tables, in report order."""
    return tuple(sorted((t for m in METRICS.values() for t in m.tables), key=lambda t: t.order))
