"""The metric registry: each metric module registers its :class:`Metric` beside its code.

A :class:`Metric` turns one Explanation into store rows (:class:`~llmattr.store.Row`): ``compute(ctx,
routing)`` with a :class:`MetricContext` (the model, the explanation, the user's options and a memo shared
by the metrics of one explanation). ``declares`` names the options that change its numbers (:class:`Option`:
``llmattr evaluate --NAME``, a config key, recorded in a store's settings; an option several metrics read is
one object they all declare), ``options`` the :class:`MetricOptions` fields it reads beside them (``seed``),
``routed`` whether it is computed once per routing (dynamic / fixed) or once in all (routing ``none``),
``tables`` the report tables it feeds (:class:`~llmattr.declarations.TableSpec`) and ``figures`` the report figures it
draws (:class:`~llmattr.declarations.FigureSpec`). ``outputs`` are further names the Python API accepts for parts of
the metric (``pi-soft-nc`` asks the ``pi-soft`` metric for its NC curve) and ``result`` gives the Python API's
own result object (a :class:`~llmattr.faithfulness.soft.SoftResult`) instead of the rows, taking the
``keywords`` options beyond the declared ones. ``llmattr evaluate --metrics``, ``llmattr.evaluate(expl,
metrics=[...])`` and ``llmattr report`` all read this registry (:func:`select`), so a new metric is one module
that calls :func:`register`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..checks import known_items, option_value, register_once
from ..declarations import FigureSpec, TableSpec
from ..errors import LlmattrError, metric_refusal
from ..store import Row

if TYPE_CHECKING:  # annotations only: the registry itself loads no model code
    from ..explanation import Explanation
    from ..models.loading import LoadedModel

NO_ROUTING = "none"


@dataclass(frozen=True)
class Option:
    """An option a metric declares (the built-in metrics' ``samples``, ``step_stride``, ``coupling`` and
    ``removal`` too): ``llmattr evaluate --NAME`` (a "Metric options" option derived from this declaration), a key
    of the TOML config and of :class:`EvalConfig`, a keyword of ``llmattr.evaluate`` and a recorded setting of the
    store. ``valid`` lists the values it takes (empty: any value of the default's type); ``positive`` asks for a
    whole number >= 1 (a count); ``lists_metrics``: the value names registered metrics (comma-separated), those
    that do not declare this option (:meth:`listable`); ``validate`` (the check hook) raises :class:`LlmattrError`
    for a value the metric cannot use, so that the CLI refuses it in one line before the model loads. Metrics that
    share an option declare the one object. A metric reads it as ``ctx.options.get(name)``."""

    name: str
    default: object
    help: str
    valid: tuple = ()
    positive: bool = False
    validate: Callable[[object], object] | None = None
    lists_metrics: bool = False

    @property
    def flag(self) -> str:
        """The command-line spelling: ``--step-stride`` for ``step_stride``."""
        return f"--{self.name.replace('_', '-')}"

    def check(self, value: object) -> object:
        """``value`` if valid (a text of a number default converted), else one line naming the option."""
        value = option_value(value, self.flag, self.default, self.positive, self.valid)
        if self.lists_metrics:
            metric_list(value, self.listable(), self.flag)
        if self.validate is not None:
            self.validate(value)
        return value

    def listable(self) -> list[str]:
        """The registered metrics a ``lists_metrics`` option may name: every one but those that declare it."""
        return sorted(name for name, metric in METRICS.items() if self not in metric.declares)


@dataclass(frozen=True)
class MetricOptions:
    """The user's settings a metric may read: the run's ``seed`` (``llmattr evaluate --seed``) and, in ``values``,
    the values given for the options the metrics declare (:class:`Option`), read with :meth:`get`."""

    seed: int = 0
    values: dict = field(default_factory=dict)

    def get(self, name: str) -> object:
        """The seed, or the value of a declared option (its default where not given)."""
        if name in BUILT_IN:
            return getattr(self, name)
        return self.values[name] if name in self.values else declared_options()[name].default


BUILT_IN = ("seed",)  # MetricOptions' own field: the run's seed, which also draws the examples and attributions


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
    declares: tuple[Option, ...] = ()
    figures: tuple[FigureSpec, ...] = ()
    outputs: tuple[str, ...] = ()
    result: Callable[[MetricContext, str, tuple[str, ...]], object] | None = None
    keywords: tuple[str, ...] = ()
    rules: tuple[str, ...] = ()  # rules of the code its values depend on (declarations.RULES), recorded in the store
    granularity: str = "token"  # "source": it reads sources (documents), so a task without them is refused up front
    needs: tuple[tuple[str, str], ...] = ()  # (declared option, why) pairs: refused up front when not given

    @property
    def option_names(self) -> tuple[str, ...]:
        """Every option that changes its numbers: the ones it names (``seed``) and the ones it declares."""
        return (*self.options, *(option.name for option in self.declares))

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
    declared = declared_options()
    taken += [option.name for option in metric.declares if option.name in BUILT_IN
              or declared.get(option.name, option) != option]
    if taken:
        raise LlmattrError(f"metric {metric.name!r}: the name(s) {', '.join(map(repr, taken))} are already "
                           f"registered (as metrics, outputs or options); register it under other names")
    register_once(METRICS, metric.name, metric, "metric")
    OUTPUTS.update(dict.fromkeys(metric.outputs, metric.name))
    return metric


def declared_options() -> dict[str, Option]:
    """Every option the registered metrics declare, by name (one declaration per name)."""
    return {option.name: option for metric in METRICS.values() for option in metric.declares}


def unregister(name: str) -> None:
    """Remove a metric and its outputs' names (a test's or a notebook's own metric)."""
    METRICS.pop(name)
    for output in [key for key, owner in OUTPUTS.items() if owner == name]:
        del OUTPUTS[output]


def select(names: list[str]) -> dict[Metric, tuple[str, ...]]:
    """The registered metrics that ``names`` (metric or output names) ask for, in order, each with the outputs
    asked of it (``()``: all of it); unknown names list the valid ones."""
    refusal = metric_refusal(names, [*METRICS, *OUTPUTS])
    if refusal is not None:
        raise LlmattrError(refusal)
    chosen: dict[Metric, tuple[str, ...]] = {}
    for name in names:
        metric = METRICS[OUTPUTS.get(name, name)]
        asked = chosen.get(metric, ())
        chosen[metric] = () if name == metric.name or (metric in chosen and not asked) else (*asked, name)
    return chosen


def metric_needs() -> dict[str, dict[str, str]]:
    """{metric: {option: why}}: the options each registered metric cannot run without (:attr:`Metric.needs`)."""
    return {name: dict(metric.needs) for name, metric in sorted(METRICS.items()) if metric.needs}


def source_metrics() -> list[str]:
    """The registered metrics that read sources (granularity ``source``)."""
    return sorted(name for name, metric in METRICS.items() if metric.granularity == "source")


def get_metrics(names: list[str]) -> list[Metric]:
    """The registered metrics of ``names`` (each once, in order): :func:`select` without the outputs."""
    return list(select(names))


def figure_specs() -> tuple[FigureSpec, ...]:
    """Every registered metric's report figures."""
    return tuple(f for m in METRICS.values() for f in m.figures)


def table_specs() -> tuple[TableSpec, ...]:
    """Every registered metric's report tables, in report order."""
    return tuple(sorted((t for m in METRICS.values() for t in m.tables), key=lambda t: t.order))


def check_needs(metrics: Sequence[str], given: Mapping, needs: Mapping[str, Mapping[str, str]]) -> None:
    """Refuse a metric asked without an option it needs (``needs``: {metric: {option: why}}, each metric's
    :attr:`~llmattr.faithfulness.Metric.needs`; ``given``: the options' values, empty or absent when not given)."""
    for metric in metrics:
        for option, why in needs.get(metric, {}).items():
            if not given.get(option):
                raise LlmattrError(f"{metric} {why}")


def metric_list(names: object, metrics: Sequence[str], flag: str) -> list[str]:
    """An option's comma-separated metric ``names`` (``--reliability-of``), each one of ``metrics``; else one line
    naming the option and listing them."""
    return known_items(names, metrics, lambda unknown: f"{flag}: unknown metric "
                       f"{', '.join(map(repr, unknown)) or repr(names)}; valid: {', '.join(sorted(metrics))}")
