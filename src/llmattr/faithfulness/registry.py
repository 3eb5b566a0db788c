"""The metric registry: each metric module registers its :class:`Metric` beside its code.

A :class:`Metric` turns one Explanation into store rows (:class:`~llmattr.store.Row`): ``compute(ctx,
routing)`` with a :class:`MetricContext` (the model, the explanation, the user's options and a memo shared
by the metrics of one explanation). ``options`` names the :class:`MetricOptions` fields that change its
numbers (recorded in a store's settings), ``routed`` whether it is computed once per routing (dynamic /
fixed) or once in all (routing ``none``), and ``tables`` the report tables it feeds
(:class:`~llmattr.specs.TableSpec`). ``llmattr evaluate --metrics``, ``llmattr.evaluate(expl,
metrics=[...])`` and ``llmattr report`` all read this registry, so a new metric is one module that calls
:func:`register`.
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

    def routings(self, wanted: tuple[str, ...]) -> tuple[str, ...]:
        """The routings it is computed under for a run asking for ``wanted``."""
        return wanted if self.routed else (NO_ROUTING,)


METRICS: dict[str, Metric] = {}


def register(metric: Metric) -> Metric:
    """Make ``metric`` available by its name (a name already taken by another metric is refused)."""
    return register_once(METRICS, metric.name, metric, "metric")


def get_metrics(names: list[str]) -> list[Metric]:
    """The registered metrics of ``names`` (each once, in order); unknown names list the valid ones."""
    unknown = [name for name in names if name not in METRICS]
    if unknown or not names:
        what = f"unknown metric {', '.join(map(repr, unknown))}" if unknown else "no metric given"
        raise LlmattrError(f"{what}; valid: {', '.join(sorted(METRICS))}")
    return [METRICS[name] for name in dict.fromkeys(names)]


def table_specs() -> tuple[TableSpec, ...]:
    """Every registered metric's report tables, in report order."""
    return tuple(sorted((t for m in METRICS.values() for t in m.tables), key=lambda t: t.order))
