"""Declarations shared by the registries and the report, free of torch: method labels and table layouts.

The report renders from a store alone, so what it needs to know about methods and metrics is plain data
here: a method's label (:func:`method_label`, from the method registry's defaults) and the tables a
metric feeds (:class:`TableSpec`, declared by each metric beside its code in
:mod:`llmattr.faithfulness`). Neither the report nor this module imports torch, the methods or the
evaluation loop. The earlier names of renamed method parameters and model card facts are here too, so that every
reader (a method, a store, a card) reads an old spelling the same way (:func:`current_params`, :func:`current_card`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field

from .errors import LlmattrError

FIGURE_KINDS = ("curves", "pi_curves", "layer_sweep", "head_curves")
LAYOUTS = ("datasets_by_methods", "metrics_by_methods", "methods_by_datasets", "layers_by_methods")


RENAMED_PARAMS = {"target": "objective"}  # a method parameter's earlier name -> its name (issue 22)
RENAMED_CARD_FACTS = {"objective": "loss"}  # a model card fact's earlier name -> its name (issue 39)


def current_names(values: Mapping, renamed: Mapping[str, str], where: str) -> dict:
    """``values`` with each key given under an earlier name (a key of ``renamed``) under its current one; both
    names at once are refused (``where`` opens that line)."""
    out = dict(values)
    for old, new in renamed.items():
        if old in out:
            if new in out:
                raise LlmattrError(f"{where}: give {new}= or its old name {old}=, not both")
            out[new] = out.pop(old)
    return out


def current_params(params: Mapping, where: str = "method parameters") -> dict:
    """``params`` with each parameter given under an earlier name (:data:`RENAMED_PARAMS`: ``target``, the
    objective's name before issue 22) under its current one, so a call, a ``name:target=logit`` spec, a store or
    an Explanation JSON of before the rename reads the same; both names at once are refused (``where`` opens
    that line)."""
    return current_names(params, RENAMED_PARAMS, where)


def held_out_summary(held: Mapping) -> tuple[str, str]:
    """A fine-tune's held-out result (``llmattr finetune``'s card) as (measure, value): ``("accuracy", "0.912 (95%
    CI ...; majority class 0.500)")``, or a regression head's ``("Pearson r", "0.81 (95% CI ..., p=...; MSE ...,
    constant predictor ...)")``."""
    if "pearson" in held:
        return "Pearson r", (f"{held['pearson']:.3f} (95% CI {held['low']:.3f}-{held['high']:.3f}, n={held['n']}, "
                             f"p={held['p']:.2g}; MSE {held['mse']:.3f}, constant predictor "
                             f"{held['constant_mse']:.3f})")
    return "accuracy", (f"{held['accuracy']:.3f} (95% CI {held['low']:.3f}-{held['high']:.3f}, n={held['n']}; "
                        f"majority class {held['majority']:.3f})")


def current_card(card: Mapping) -> dict:
    """A model card of ``llmattr finetune`` (or the facts of it a store holds) with each fact given under an
    earlier name (:data:`RENAMED_CARD_FACTS`: ``objective``, the training loss's name before issue 39) under its
    current one, in the card and in the settings it records, so a card or a store written before the rename
    reads the same (and an unfinished run of then resumes)."""
    out = current_names(card, RENAMED_CARD_FACTS, "model card")
    if isinstance(out.get("settings"), Mapping):
        out["settings"] = current_names(out["settings"], RENAMED_CARD_FACTS, "model card settings")
    return out


# The rules of the code that stored values depend on, recorded in a store's settings by the metrics that use them
# (``Metric.rules``), so that a store never mixes values of two rules and a report says which one it shows.
RETAIN_RULE = "retain_rule"
RULES = {RETAIN_RULE: "exact"}  # each rule's current version
RULE_VERSIONS = {
    (RETAIN_RULE, "exact"): "pi-Soft's alpha search without a clip: mean(s^alpha) = pi solved exactly, the limits "
                            "filled (docs/faithfulness.md); invariant to s -> s^c",
    (RETAIN_RULE, "clip"): "pi-Soft's alpha search on s clipped to [1e-6, 1 - 1e-6] (stores of schema <= 4); not "
                           "invariant to s -> s^c, no longer computed",
}
# The metrics whose values a store of schema <= 4 computed under the clip (the rule was not recorded then).
CLIPPED_METRICS = ("pi-soft", "source-soft", "reliability")


def method_label(name: str, params: dict | str, defaults: Mapping | None) -> str:
    """``name`` plus the parameters that differ from the method's ``defaults`` (all of them if unknown)."""
    params = current_params(json.loads(params) if isinstance(params, str) else params)
    defaults = defaults if defaults is not None else {}
    extra = [f"{k}={v}" for k, v in sorted(params.items()) if k not in defaults or defaults[k] != v]
    return ":".join([name, *extra])


# the trust metrics (faithfulness.sanity, faithfulness.reliability) and the report's trust section (report.trust)
FAIL_RHO = 0.5  # a method fails a sanity check when the whole 95% interval of rho lies above this (docs/trust.md)
SANITY_ROWS = ("cascade_spearman", "independent_spearman", "data_spearman")  # the sanity checks' stored rows
MINOR = ("seed", "power")  # reliability: perturbations that must not change a metric's verdict (noise resilience)
DISRUPTIVE = ("shuffle", "invert")  # reliability: perturbations that must (adversarial reactivity)
UNPERTURBED = "none"  # reliability: the row suffix of the value on the explanation itself
PERTURBED_SEP = "|"  # reliability: a stored row is named ``<value>|<perturbation>``


@dataclass(frozen=True)
class MetricRow:
    """One stored value name in a table: stored name, display name, direction and number format."""

    metric: str
    title: str
    higher: bool
    fmt: str = ".3f"


@dataclass(frozen=True)
class TableSpec:
    """A report table fed by a metric: rows (stored value names), the routing they were computed under,
    and the layout (``datasets_by_methods``: paper 000 Tables 1/4/8; ``metrics_by_methods``: Table 2;
    ``methods_by_datasets``: paper 003 Tables 1, 4-6; ``layers_by_methods``: paper 003 Figs. 4-5 as a table,
    rows = layers (the stored ``x``), datasets pooled, with a per-layer figure). ``order`` places it among the
    report's tables; ``mark_all_rows`` ranks every row of a ``datasets_by_methods`` or ``layers_by_methods``
    table (else the Avg row only, or none)."""

    name: str
    title: str
    caption: str
    layout: str
    rows: tuple[MetricRow, ...]
    routing: str = "none"
    order: float = 100.0
    mark_all_rows: bool = False

    def __post_init__(self):
        if self.layout not in LAYOUTS:
            raise ValueError(f"unknown table layout {self.layout!r}; valid: {', '.join(LAYOUTS)}")


@dataclass(frozen=True)
class FigureSpec:
    """A report figure fed by a metric, in one of the figure kinds (as a table has a layout). ``curves``: per
    dataset, each row's stored values against the stored x (a curve metric's grid, a fraction, K), a panel per
    row, a line per method (mean over examples with its 95% bootstrap band), into ``<name>_<dataset>.png``.
    ``pi_curves``: paper 000 Fig. 3/9, the rows' curves (with their ``<row>_auc`` means in the legend) per dataset
    and routing. ``layer_sweep``: paper 000 Fig. 5, the rows (AUCs) against a method's swept parameter
    (:class:`Catalog`'s ``layer_sweeps``). ``head_curves``: as ``curves``, for a model fine-tuned with a sequence head
    only (its model card's task is one of :class:`Catalog`'s ``head_tasks``; paper 003 Figs. 2-3)."""

    name: str
    title: str
    caption: str
    rows: tuple[MetricRow, ...]
    xlabel: str = "x"
    routing: str = "none"
    kind: str = "curves"

    def __post_init__(self):
        if self.kind not in FIGURE_KINDS:
            raise ValueError(f"unknown figure kind {self.kind!r}; valid: {', '.join(FIGURE_KINDS)}")


@dataclass(frozen=True)
class Catalog:
    """What the report knows beyond the store: the tables and figures of the registered metrics, each method's default
    parameters (for labels), the parameter a method's layer sweep varies (``AttributionMethod.layer_sweep``) and
    each task's place and display name in the report (``Task.report_order``, ``Task.display``) and the controls,
    the methods every other one is tested against and never ranked (``AttributionMethod.control``: ``random``).
    :func:`llmattr.api.catalog` builds it from the registries."""

    tables: tuple[TableSpec, ...] = ()
    method_defaults: Mapping[str, Mapping] | None = None
    figures: tuple[FigureSpec, ...] = ()
    layer_sweeps: Mapping[str, str] | None = None
    datasets: Mapping[str, tuple[float, str]] | None = None  # task name -> (report_order, display name)
    controls: tuple[str, ...] = ()  # method names
    head_tasks: tuple[str, ...] = ()  # tasks read by a sequence head (``Task.head`` not ``"lm"``)

    def label(self, name: str, params: dict | str) -> str:
        return method_label(name, params, (self.method_defaults or {}).get(name))


def asked(default: object = None, help: str = "", option: type | None = None, *decls: str, **kwargs):
    """A dataclass field a user asks for, written once: its default, its ``help`` (the command line's, where
    ``option`` is its type there, with its flags ``decls`` when not the field's name; else the Python API's alone),
    read by the CLI (:func:`llmattr.cli.app.field_option`) and the docs. ``kwargs``: ``default_factory``,
    ``compare``."""
    if "default_factory" not in kwargs:
        kwargs["default"] = default
    return field(metadata={"help": help, "option": option, "decls": decls}, **kwargs)
