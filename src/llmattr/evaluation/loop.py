"""The evaluation loop of ``llmattr evaluate``: datasets x methods x metrics into a resumable store.

One *unit* is (dataset, example, method with its params). For each unit the loop computes the
Explanation once (or reuses the stored one), then every requested metric (:mod:`llmattr.faithfulness`'s
registry) under every requested routing that the store does not yet hold, and writes all of it in one
transaction (:mod:`llmattr.store`).

Randomness: before each attribution the torch RNG is seeded from (seed, dataset, example, method,
params); the metrics get the user's seed and derive their own per-example generators from it. So
results do not depend on the order of work, on resuming, or on how examples are sharded.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from rich import progress as rp

from .. import methods
from ..api import attribute, prepare
from ..declarations import RULES
from ..errors import LlmattrError
from ..explanation import Explanation
from ..faithfulness import Metric, MetricContext, get_metrics, metric_needs
from ..faithfulness.head import head_explanation
from ..faithfulness.registry import check_needs
from ..lazy import torch
from ..models.card import card_facts, read_card
from ..models.loading import LoadedModel, load_model
from ..render import progress_console
from ..request import Request
from ..stats import stable_seed
from ..store import MetricOutput, Store, Unit
from ..tasks import TASKS
from ..tasks.base import task_facts
from .config import EvalConfig
from .method_specs import MethodSpec, expand_methods
from .run_datasets import (
    Dataset,
    DatasetLoader,
    dataset_names,
    expand_datasets,
    file_dataset,
    load_dataset,
    trained_rows,
)
from .sharding import rule_setting, shard_device, shard_examples, shard_of, shard_path, shard_rule


@dataclass
class Summary:
    """What a run did: units computed, skipped because already stored, and failed (with reasons)."""

    out: Path
    computed: int = 0
    skipped: int = 0
    failed: list[str] = field(default_factory=list)
    seconds: float = 0.0
    excluded: dict[str, int] = field(default_factory=dict)  # per dataset: rows the model was trained on


@dataclass
class _Pending:
    dataset: Dataset
    example: dict
    spec: MethodSpec
    unit: Unit
    needed: list[tuple[Metric, str]]


def run_settings(cfg: EvalConfig, metrics: list[Metric], lm: LoadedModel, card: dict | None = None) -> dict:
    """The settings that change stored values: the explanations' (seed, target, ...) and the options and rules of
    the code (:data:`~llmattr.declarations.RULES`) of ``metrics`` (a store refuses a run where a setting it holds
    has another value), plus the model's number of layers (``layers=all`` in the Fig. 5 sweep) and a fine-tuned
    model's card facts."""
    keys = sorted({"seed", "max_new_tokens", "target", "scope", *(k for m in metrics for k in m.option_names)})
    text_config = lm.config.get_text_config() if hasattr(lm.config, "get_text_config") else lm.config
    n_layers = getattr(text_config, "num_hidden_layers", None) or getattr(text_config, "n_layer", None)
    return {"n_layers": n_layers, **{key: cfg.option(key) for key in keys},
            **{rule: RULES[rule] for m in metrics for rule in m.rules},
            **({"model_card": card_facts(card)} if card else {})}


def _pending(store: Store, model_id: str, data: list[Dataset], specs: list[MethodSpec],
          metrics: list[Metric], routings: tuple[str, ...]) -> tuple[list[_Pending], dict, int]:
    """Units still to do, the per-(dataset, method) totals, and how many are already done."""
    pending, totals, done = [], {}, 0
    wanted = [(m, r) for m in metrics for r in m.routings(routings)]
    for ds in data:
        for spec in specs:
            totals[(ds.name, spec)] = len(ds.examples)
        for example in ds.examples:
            for spec in specs:
                unit = Unit(model_id, ds.name, str(example["id"]), spec.name, spec.key)
                have = store.done(unit)
                needed = [(m, r) for m, r in wanted if (m.name, r) not in have]
                if needed:
                    pending.append(_Pending(ds, example, spec, unit, needed))
                else:
                    done += 1
    return pending, totals, done


def _explain(lm: LoadedModel, item: _Pending, target_cache: dict, cfg: EvalConfig) -> Explanation:
    """Attribute one unit; the request and its target (greedy generation) are shared by all methods of an
    example."""
    task = item.dataset.task
    if task.head != "lm":  # a sequence head (llmattr finetune --head): no generation, paper 003's methods
        return head_explanation(lm, task, dict(item.example), item.spec.name,
                                stable_seed(cfg.seed, *item.unit.as_tuple()[1:], bits=31))
    key = (item.dataset.name, item.unit.example)
    if key not in target_cache:
        target_cache.clear()
        fields_ = task.inputs(item.example)
        request = Request(task, target=cfg.target, gold=item.example.get("label"), scope=cfg.scope,
                          max_new_tokens=cfg.max_new_tokens)
        target_cache[key] = request, prepare(lm, fields_, request)
    request, target = target_cache[key]
    torch.manual_seed(stable_seed(cfg.seed, *item.unit.as_tuple()[1:], bits=31))
    return attribute(lm, target, item.spec.build(), request, dict(item.example))


def _progress(disable: bool) -> rp.Progress:
    return rp.Progress(rp.TextColumn("{task.description}"), rp.BarColumn(), rp.MofNCompleteColumn(),
                       rp.TimeElapsedColumn(), rp.TextColumn("ETA"), rp.TimeRemainingColumn(),
                       disable=disable, console=progress_console())  # stderr; redrawn only on a terminal


@dataclass
class Plan:
    """What a run is, checked and read before its model loads (:func:`plan`): this process's shard ``rank`` of
    ``world``, the metrics, the method specs, the finetune's card of the model (None: not a finetune's folder) and
    the sampled datasets."""

    rank: int
    world: int
    metrics: list[Metric]
    specs: list[MethodSpec]
    card: dict | None
    loaded: list[Dataset]


def plan(cfg: EvalConfig, loader: DatasetLoader = load_dataset) -> Plan:
    """Every check of ``cfg`` that needs no model, in one order, and the datasets it samples: the settings
    (:meth:`EvalConfig.validate`), the shard, the metric and method names with each method's parameters, the
    datasets (a file's rows and labels, ``n`` examples balanced per class; never a row the finetune in
    ``cfg.model`` was trained on) and what the metrics and methods need of them (:func:`check_work`). Imports no
    torch: ``llmattr evaluate`` calls it before the model loads, as :func:`run` does."""
    cfg.validate()
    rank, world = shard_of(cfg)
    metrics = get_metrics(cfg.metrics)
    specs = expand_methods(cfg.methods, cfg.layers)
    card = read_card(cfg.model)
    exclude = trained_rows(card)
    n = cfg.sample_size()
    if cfg.data is not None:
        loaded = [file_dataset(cfg.data, cfg.task, n, cfg.seed, cfg.text_field, cfg.label_field, cfg.labels,
                               exclude)]
    else:
        loaded = [loader(name, n, cfg.seed, **({"exclude": exclude} if exclude else {}))
                  for name in expand_datasets(cfg.dataset_names())]
    check_work(cfg, metrics, specs, loaded)
    return Plan(rank, world, metrics, specs, card, loaded)


def run(cfg: EvalConfig, lm: LoadedModel | None = None, loader: DatasetLoader = load_dataset,
        progress: bool = True, planned: Plan | None = None) -> Summary:
    """Evaluate ``cfg``: every (dataset, example, method, metric, routing) not yet in the store.

    Everything is checked before the model loads (:func:`plan`; ``planned``: its result where the caller has it).
    This process is shard ``rank`` of ``world`` (``--shard``, torchrun/accelerate's or Slurm's environment), writes
    its own store file and takes the examples its store's shard rule gives it
    (:func:`~llmattr.evaluation.sharding.shard_examples`: balanced by estimated cost; ``i::n`` in a store written
    before balancing).
    """
    start = time.perf_counter()
    planned = planned or plan(cfg, loader)
    rank, world, metrics, specs, loaded = planned.rank, planned.world, planned.metrics, planned.specs, planned.loaded
    routings = cfg.routings
    summary = Summary(out=shard_path(cfg.out, rank, world), excluded={ds.name: ds.excluded for ds in loaded})
    fresh = not summary.out.exists()
    with Store(summary.out) as store:  # refuses a foreign file or a store another run writes, before the load
        if lm is None:
            lm = _load(cfg, summary.out if fresh else None, store)
        rule = shard_rule(store.settings(lm.model_id))
        store.check_settings(lm.model_id, {**run_settings(cfg, metrics, lm, planned.card), **rule_setting(rule)})
        data = shard_examples(loaded, rank, world, rule)
        pending, totals, summary.skipped = _pending(store, lm.model_id, data, specs, metrics, routings)
        store.plan(lm.model_id, [(d.name, s.name, s.key, len(d.examples)) for d in data for s in specs],
                   [(m.name, r) for m in metrics for r in m.routings(routings)])  # llmattr status's totals
        left = {key: 0 for key in totals}
        for item in pending:
            left[(item.dataset.name, item.spec)] += 1
        bar = _progress(disable=not progress)
        tasks = {key: bar.add_task(f"{key[0]} {key[1].label}", total=total,
                                   completed=total - left[key]) for key, total in totals.items()}
        target_cache: dict = {}
        with bar:
            for item in pending:
                try:
                    _run_unit(lm, item, store, target_cache, cfg)
                    summary.computed += 1
                except LlmattrError as err:
                    summary.failed.append(f"{item.unit.dataset}/{item.unit.example} {item.spec.name}: {err}")
                    store.fail(item.unit, str(err))
                bar.advance(tasks[(item.dataset.name, item.spec)])
    summary.seconds = time.perf_counter() - start
    return summary


def check_work(cfg: EvalConfig, metrics: list[Metric], specs: list[MethodSpec], loaded: list[Dataset]) -> None:
    """Before the model loads: each metric's needed options (:attr:`Metric.needs`) and, where a method or a metric
    works on sources, sources in every evaluated task (the checks ``llmattr evaluate`` runs before torch)."""
    check_needs([metric.name for metric in metrics], cfg.options, metric_needs())
    asked = [*(spec.name for spec in specs if methods.REGISTRY[spec.name].granularity == "source"),
             *(metric.name for metric in metrics if metric.granularity == "source")]
    check_sources_asked(list(dict.fromkeys(asked)), [task_facts(ds.task) for ds in loaded],
                        [name for name in dataset_names() if TASKS[name].documents])


def _load(cfg: EvalConfig, fresh: Path | None, store: Store) -> LoadedModel:
    """The run's model; a model that cannot be loaded leaves no store behind when this run created it."""
    try:
        return load_model(cfg.model, device=shard_device(cfg.device), dtype=cfg.dtype, device_map=cfg.device_map,
                          max_memory=cfg.max_memory, load_in_4bit=cfg.load_in_4bit)
    except BaseException:
        if fresh is not None:
            store.close()
            for leftover in (fresh, fresh.with_name(fresh.name + "-wal"), fresh.with_name(fresh.name + "-shm")):
                leftover.unlink(missing_ok=True)
        raise


def _run_unit(lm: LoadedModel, item: _Pending, store: Store, target_cache: dict, cfg: EvalConfig) -> None:
    """Explanation (stored or new), then every missing metric x routing, written in one transaction."""
    stored = store.explanation(item.unit)
    if stored is None:
        expl = _explain(lm, item, target_cache, cfg)
        attribution_s = float(expl.timings.get("attribution_s", 0.0))
        text = expl.to_json()
    else:
        text, attribution_s = stored
        expl = Explanation.from_json(text)
    ctx = MetricContext(lm, expl, cfg.metric_options())
    outputs = []
    for metric, routing in item.needed:
        t0 = time.perf_counter()
        rows = metric.compute(ctx, routing)
        outputs.append(MetricOutput(metric.name, routing, time.perf_counter() - t0, rows))
    store.write(item.unit, text, attribution_s, outputs)


def check_sources_asked(asked: Sequence[str], tasks: Sequence[Mapping], with_sources: Sequence[str]) -> None:
    """Refuse source-level work (``asked``: the methods and metrics that score or read sources) on a task whose
    prompts have none (``tasks``: :func:`task_facts` of the evaluated datasets' tasks), naming the datasets that have
    them (``with_sources``) and the tasks a user's own ``--data`` file can take them by."""
    lacking = [task["name"] for task in tasks if not task["documents"]]
    if asked and lacking:
        raise LlmattrError(f"{asked[0]} works on sources (documents) and {lacking[0]}'s prompts have none: evaluate "
                           f"it on a dataset with sources ({', '.join(with_sources)}) or on your own file "
                           "(--data FILE --task context, each row's documents in its 'documents' field)")
