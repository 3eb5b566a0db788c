"""The evaluation loop of ``llmattr evaluate``: datasets x methods x metrics into a resumable store.

One *unit* is (dataset, example, method with its params). For each unit the runner computes the
Explanation once (or reuses the stored one), then every requested metric under every requested routing
that the store does not yet hold, and writes all of it in one transaction (:mod:`llmattr.store`).

Metrics are plugged in through small adapters (:class:`MetricAdapter`, :func:`register_metric`): a
function from (model, explanation, routing, config) to :class:`~llmattr.store.Row` values, the
options that change its values (recorded in the store's settings), and whether routing applies.

Randomness: before each attribution the torch RNG is seeded from (seed, dataset, example, method,
params); the metrics get the user's seed and derive their own per-example generators from it. So
results do not depend on the order of work, on resuming, or on how examples are sharded.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
from pathlib import Path

import torch

from . import methods as method_registry
from .checks import positive_int
from .errors import LlmattrError
from .explanation import Explanation
from .faithfulness.ranking import REMOVALS
from .faithfulness.soft import COUPLINGS
from .models.loading import LoadedModel
from .store import MetricOutput, Row, Store, Unit, canonical
from .targets import SCOPES, TARGET_MODES

ROUTINGS = ("dynamic", "fixed")
NO_ROUTING = "none"


# ---------------------------------------------------------------------------------------- configuration
@dataclass
class EvalConfig:
    """Everything ``llmattr evaluate`` needs; the CLI options and the TOML config file hold the same keys."""

    model: str = "default"
    datasets: list[str] = field(default_factory=lambda: ["sst2"])
    methods: list[str] = field(default_factory=lambda: ["grad-ellm"])
    metrics: list[str] = field(default_factory=lambda: ["pi-soft"])
    routing: str = "dynamic"
    n: int = 50
    samples: int = 15
    seed: int = 0
    coupling: str = "coupled"
    layers: list[str] | None = None
    step_stride: int = 5
    max_new_tokens: int | None = None
    target: str = "label"
    scope: str = "span"
    removal: str = "zero"
    out: str = "results.sqlite"
    shard: str | None = None
    device: str = "auto"
    dtype: str | None = None
    device_map: str | None = None
    load_in_4bit: bool = False

    @classmethod
    def from_mapping(cls, data: dict, base: EvalConfig | None = None) -> EvalConfig:
        """A config from a dict (TOML file or CLI values); ``None`` values keep ``base``'s."""
        names = {f.name for f in fields(cls)}
        data = {k.replace("-", "_"): v for k, v in data.items() if v is not None}
        unknown = sorted(set(data) - names)
        if unknown:
            valid = ", ".join(sorted(names))
            raise LlmattrError(f"unknown config key(s) {', '.join(unknown)}; valid: {valid}")
        for key in ("datasets", "methods", "metrics", "layers"):
            if isinstance(data.get(key), str | int):
                data[key] = split_list(str(data[key]))
        return replace(base or cls(), **data)

    @classmethod
    def from_toml(cls, path: str | Path) -> EvalConfig:
        import tomllib

        try:
            with open(path, "rb") as handle:
                return cls.from_mapping(tomllib.load(handle))
        except FileNotFoundError as err:
            raise LlmattrError(f"config file not found: {path}") from err
        except tomllib.TOMLDecodeError as err:
            raise LlmattrError(f"{path} is not valid TOML: {err}") from err

    def validate(self) -> None:
        """Refuse bad values before the model loads and before anything is stored."""
        for name in ("n", "samples", "step_stride"):
            positive_int(getattr(self, name), f"--{name.replace('_', '-')}")
        if self.max_new_tokens is not None:
            positive_int(self.max_new_tokens, "--max-new-tokens")
        if not isinstance(self.seed, int) or isinstance(self.seed, bool):
            raise LlmattrError(f"--seed must be a whole number, got {self.seed!r}")
        for key, valid in (("target", TARGET_MODES), ("scope", SCOPES), ("removal", REMOVALS)):
            if getattr(self, key) not in valid:
                raise LlmattrError(f"{key} must be one of {', '.join(valid)}; got {getattr(self, key)!r}")
        if self.coupling not in COUPLINGS:
            raise LlmattrError(f"unknown coupling {self.coupling!r}; valid: {', '.join(COUPLINGS)}")

    @property
    def routings(self) -> tuple[str, ...]:
        if self.routing == "both":
            return ROUTINGS
        if self.routing not in ROUTINGS:
            raise LlmattrError(f"unknown routing {self.routing!r}; valid: dynamic, fixed, both")
        return (self.routing,)


def split_list(text: str) -> list[str]:
    """``"a,b, c"`` -> ``["a", "b", "c"]`` (empty items dropped)."""
    return [item.strip() for item in text.split(",") if item.strip()]


# ---------------------------------------------------------------------------------------- methods
@dataclass(frozen=True)
class MethodSpec:
    """A method name with its full parameters as canonical JSON (``key``, the store's params column).

    On the CLI: ``name[:param=value]...``, e.g. ``grad-ellm:layers=4:attention=softmax``.
    """

    name: str
    key: str

    @property
    def params(self) -> dict:
        return json.loads(self.key)

    @property
    def label(self) -> str:
        return method_label(self.name, self.key)

    def build(self) -> method_registry.AttributionMethod:
        return method_registry.get(self.name, **self.params)


def method_label(name: str, params: dict | str) -> str:
    """``name`` plus the parameters that differ from the method's defaults (all of them if unknown)."""
    params = json.loads(params) if isinstance(params, str) else params
    cls = method_registry.REGISTRY.get(name)
    defaults = cls.defaults if cls is not None else {}
    extra = [f"{k}={v}" for k, v in sorted(params.items()) if k not in defaults or defaults[k] != v]
    return ":".join([name, *extra])


def _cast(value: str) -> int | float | str:
    for cast in (int, float):
        try:
            return cast(value)
        except ValueError:
            continue
    return value


def parse_method(text: str) -> MethodSpec:
    """Parse ``name[:key=value]...``; unknown names and parameters list the valid ones."""
    name, *items = text.split(":")
    params = {}
    for item in items:
        if "=" not in item:
            raise LlmattrError(f"method parameter {item!r} in {text!r} must be key=value "
                               "(e.g. grad-ellm:layers=4)")
        key, value = item.split("=", 1)
        params[key.strip()] = _cast(value.strip())
    method = method_registry.get(name.strip(), **params)  # validates name and parameters
    return MethodSpec(method.name, canonical(method.params))


LAYER_SWEEP = ("grad-ellm",)  # methods whose ``layers`` is the number of last layers aggregated (Fig. 5)


def expand_methods(texts: list[str], layers: list[str] | None = None) -> list[MethodSpec]:
    """Method specs in the given order; ``layers`` sweeps the number of aggregated layers of Grad-ELLM."""
    specs: list[MethodSpec] = []
    for text in texts:
        spec = parse_method(text)
        variants = [spec]
        if layers and spec.name in LAYER_SWEEP and ":layers=" not in text:
            variants = [parse_method(f"{text}:layers={k}") for k in layers]
        specs.extend(v for v in variants if v not in specs)
    if not specs:
        raise LlmattrError(f"no method given; valid: {', '.join(method_registry.available())}")
    return specs


# ---------------------------------------------------------------------------------------- metrics
MetricFn = Callable[[LoadedModel, Explanation, str, "EvalConfig"], list[Row]]


@dataclass(frozen=True)
class MetricAdapter:
    """How the runner calls one metric family.

    ``compute(lm, explanation, routing, config)`` returns the rows of one example; ``options`` lists
    the config values that change its numbers (they go into the store's settings); ``routed`` says
    whether it is computed once per routing (dynamic/fixed) or once in all (routing ``none``).
    """

    name: str
    compute: MetricFn
    options: tuple[str, ...] = ()
    routed: bool = False
    summary: str = ""


METRICS: dict[str, MetricAdapter] = {}


def register_metric(adapter: MetricAdapter) -> MetricAdapter:
    METRICS[adapter.name] = adapter
    return adapter


def _soft_rows(lm: LoadedModel, expl: Explanation, routing: str, cfg: EvalConfig, curves: bool) -> list[Row]:
    """pi-Soft-NC/NS curves and AUCs (``curves``) or Soft-NC/NS at alpha = 1 and E[R] (paper 000 eqs. 4-7).

    Soft-NC/NS and E[R] come from a one-point grid, so ``soft`` costs 2 instead of 20 perturbation
    rows per sample; the two metric families never share rows, so either can be added to a store later.
    """
    from .faithfulness import evaluate

    result = evaluate(expl, model=lm, metrics=("pi-soft-nc", "pi-soft-ns"), routing=routing,
                      samples=cfg.samples, seed=cfg.seed, pis=None if curves else (0.5,),
                      step_stride=cfg.step_stride, coupling=cfg.coupling).to_dict()
    values, se = result["metrics"], result["mc_se"]
    if not curves:
        return [Row(name, values[name], se=se.get(name)) for name in ("soft_ns", "soft_nc", "expected_retained")]
    rows = []
    for name in ("pi_soft_ns", "pi_soft_nc"):
        curve = values[name]
        rows += [Row(name, v, pi=p, se=e) for p, v, e in zip(curve["pi"], curve["values"], se[name], strict=True)]
        rows.append(Row(f"{name}_auc", curve["auc"], se=se[f"{name}_auc"]))
    return rows


register_metric(MetricAdapter(
    "pi-soft", lambda lm, expl, routing, cfg: _soft_rows(lm, expl, routing, cfg, curves=True),
    options=("samples", "step_stride", "coupling"), routed=True,
    summary="pi-Soft-NC/NS curves over pi = 0.05..0.95 and their AUC (paper 000 eq. 7; Tables 1, 8)"))
register_metric(MetricAdapter(
    "soft", lambda lm, expl, routing, cfg: _soft_rows(lm, expl, routing, cfg, curves=False),
    options=("samples", "step_stride", "coupling"), routed=True,
    summary="original Soft-NC/NS (alpha = 1) and E[R] (paper 000 eqs. 4-5; Table 2)"))


_RANKING_CACHE: dict = {}


def _ranking(lm: LoadedModel, expl: Explanation, removal: str = "zero"):
    """All ranking metrics of the explanation's first step in one batched call, shared by the three
    ranking adapters of one unit (the last result is kept for the same Explanation object)."""
    from .faithfulness.ranking import ranking_metrics

    if _RANKING_CACHE.get("expl") is not expl or _RANKING_CACHE.get("removal") != removal:
        _RANKING_CACHE.update(expl=expl, removal=removal, result=ranking_metrics(expl, lm, removal=removal))
    return _RANKING_CACHE["result"]


def _gold_index(expl: Explanation) -> int | None:
    """Index of the gold label among the task's label words (None when there is no gold label)."""
    from .tasks import TASKS

    task = TASKS.get(expl.task or "")
    label = expl.example.get("label")
    words = list(task.label_words) if task is not None else []
    return words.index(label) if label in words else None


def _deletion_insertion_rows(lm, expl, routing, cfg) -> list[Row]:
    """Deletion/insertion flip-probability curves, their AUCs and the AUCs of the change in flip probability
    from the clean input (paper 000 appendix E's quantity; Table 4)."""
    r = _ranking(lm, expl, cfg.removal)
    rows = []
    for name, curve in (("deletion", r.deletion), ("insertion", r.insertion)):
        rows += [Row(name, v, pi=f) for f, v in zip(curve.fractions, curve.flip, strict=True)]
        rows += [Row(f"{name}_auc", curve.auc), Row(f"{name}_change_auc", curve.change_auc)]
    return rows


def _comp_suff_rows(lm, expl, routing, cfg) -> list[Row]:
    """Comprehensiveness/sufficiency confidence drops per K and, with a gold label, whether the perturbed
    prediction is correct (paper 003 eqs. 5-8; averaged over K and examples in its Tables 1, 4-6)."""
    r = _ranking(lm, expl, cfg.removal)
    gold = _gold_index(expl)
    rows = []
    for name, drops, preds in (("comprehensiveness", r.comprehensiveness, r.comprehensiveness_pred),
                               ("sufficiency", r.sufficiency, r.sufficiency_pred)):
        rows += [Row(name, v, pi=k) for k, v in zip(r.k_grid, drops, strict=True)]
        if gold is not None:
            rows += [Row(f"{name}_acc", float(p == gold), pi=k) for k, p in zip(r.k_grid, preds, strict=True)]
    return rows


def _log_odds_rows(lm, expl, routing, cfg) -> list[Row]:
    """Paper 004 appendix A.4 at the top 20%: log-odds, comprehensiveness and sufficiency."""
    r = _ranking(lm, expl, cfg.removal)
    return [Row("log_odds", r.log_odds), Row("comprehensiveness_top_k", r.comprehensiveness_top_k),
            Row("sufficiency_top_k", r.sufficiency_top_k)]


register_metric(MetricAdapter("deletion-insertion", _deletion_insertion_rows, options=("removal",),
                              summary="deletion/insertion flip-probability AUC (paper 000 app. E; Table 4)"))
register_metric(MetricAdapter("comp-suff", _comp_suff_rows, options=("removal",),
                              summary="comprehensiveness/sufficiency per K with accuracy (paper 003 Tables 1, 4-6)"))
register_metric(MetricAdapter("log-odds", _log_odds_rows, options=("removal",),
                              summary="log-odds, comprehensiveness, sufficiency at top 20% (paper 004 A.4)"))


def get_metrics(names: list[str]) -> list[MetricAdapter]:
    unknown = [name for name in names if name not in METRICS]
    if unknown or not names:
        what = f"unknown metric {', '.join(map(repr, unknown))}" if unknown else "no metric given"
        raise LlmattrError(f"{what}; valid: {', '.join(sorted(METRICS))}")
    return [METRICS[name] for name in dict.fromkeys(names)]


def run_settings(cfg: EvalConfig, metrics: list[MetricAdapter], lm: LoadedModel) -> dict:
    """The settings that change stored values (a store refuses a run whose settings differ), plus the
    model's number of layers (``layers=all`` in the Fig. 5 sweep)."""
    keys = sorted({"seed", "max_new_tokens", "target", "scope", *(k for m in metrics for k in m.options)})
    text_config = lm.config.get_text_config() if hasattr(lm.config, "get_text_config") else lm.config
    n_layers = getattr(text_config, "num_hidden_layers", None) or getattr(text_config, "n_layer", None)
    return {"n_layers": n_layers, **{key: getattr(cfg, key) for key in keys}}


# ---------------------------------------------------------------------------------------- sharding
def shard_of(cfg: EvalConfig) -> tuple[int, int]:
    """(rank, world size) from ``--shard i/n``, else from torchrun/accelerate's RANK and WORLD_SIZE."""
    if cfg.shard:
        try:
            rank, world = (int(part) for part in cfg.shard.split("/"))
        except ValueError as err:
            raise LlmattrError(f"--shard expects i/n (e.g. 0/2), got {cfg.shard!r}") from err
    else:
        rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    if world < 1 or not 0 <= rank < world:
        raise LlmattrError(f"shard {rank}/{world} is out of range: use i/n with 0 <= i < n")
    return rank, world


def shard_path(out: str | Path, rank: int, world: int) -> Path:
    """``results.sqlite`` for one process, ``results.rank{i}.sqlite`` for shard i of several."""
    out = Path(out)
    return out if world == 1 else out.with_name(f"{out.stem}.rank{rank}{out.suffix or '.sqlite'}")


def shard_device(device: str) -> str:
    """Under torchrun/accelerate each process takes GPU ``LOCAL_RANK`` when the device is ``auto``."""
    if device == "auto" and torch.cuda.is_available() and "LOCAL_RANK" in os.environ:
        return f"cuda:{int(os.environ['LOCAL_RANK'])}"
    return device


def stable_seed(*parts: object) -> int:
    """A 31-bit seed from the parts' text (independent of PYTHONHASHSEED and of the order of work)."""
    digest = hashlib.sha256("\x1f".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:4], "little") & 0x7FFFFFFF


# ---------------------------------------------------------------------------------------- datasets
@dataclass
class Dataset:
    """A named list of examples (each a dict with an ``id``) and the task that prompts them."""

    name: str
    task: object
    examples: list[dict]


DatasetLoader = Callable[[str, int, int], Dataset]


def dataset_names() -> list[str]:
    """Tasks that name a sample data file (``sst2``, ``imdb``, ``boolq``, ...): the valid ``--datasets``."""
    from .tasks import TASKS

    return sorted(name for name, task in TASKS.items() if getattr(task, "data", None))


def load_dataset(name: str, n: int, seed: int) -> Dataset:
    """``n`` examples of dataset ``name`` (its task's sample file in llmattr/data), balanced, seeded."""
    from .tasks import get_task, load_examples

    if name not in dataset_names():
        raise LlmattrError(f"unknown dataset {name!r}; valid: {', '.join(dataset_names())}")
    task = get_task(name)
    return Dataset(name, task, load_examples(task, n=n, seed=seed))


# ---------------------------------------------------------------------------------------- the loop
@dataclass
class Summary:
    """What a run did: units computed, skipped because already stored, and failed (with reasons)."""

    out: Path
    computed: int = 0
    skipped: int = 0
    failed: list[str] = field(default_factory=list)
    seconds: float = 0.0


@dataclass
class _Pending:
    dataset: Dataset
    example: dict
    spec: MethodSpec
    unit: Unit
    needed: list[tuple[MetricAdapter, str]]


def _plan(store: Store, model_id: str, data: list[Dataset], specs: list[MethodSpec],
          metrics: list[MetricAdapter], routings: tuple[str, ...]) -> tuple[list[_Pending], dict, int]:
    """Units still to do, the per-(dataset, method) totals, and how many are already done."""
    pending, totals, done = [], {}, 0
    wanted = [(m, r) for m in metrics for r in (routings if m.routed else (NO_ROUTING,))]
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
    """Attribute one unit; the target (greedy generation) is shared by all methods of an example."""
    from .api import attribute, prepare

    task = item.dataset.task
    key = (item.dataset.name, item.unit.example)
    if key not in target_cache:
        target_cache.clear()
        fields_ = {name: item.example[name] for name in task.fields}
        target_cache[key] = prepare(lm, fields_, task, cfg.max_new_tokens, target=cfg.target,
                                    gold=item.example.get("label"), scope=cfg.scope)
    torch.manual_seed(stable_seed(cfg.seed, *item.unit.as_tuple()[1:]))
    return attribute(lm, target_cache[key], item.spec.build(), task, dict(item.example))


def _progress(disable: bool):
    from rich import progress as rp

    return rp.Progress(rp.TextColumn("{task.description}"), rp.BarColumn(), rp.MofNCompleteColumn(),
                       rp.TimeElapsedColumn(), rp.TextColumn("ETA"), rp.TimeRemainingColumn(),
                       disable=disable)


def run(cfg: EvalConfig, lm: LoadedModel | None = None, loader: DatasetLoader = load_dataset,
        progress: bool = True) -> Summary:
    """Evaluate ``cfg``: every (dataset, example, method, metric, routing) not yet in the store.

    Names are validated before the model loads. This process takes examples ``rank::world`` of each
    dataset (``--shard`` or torchrun/accelerate env) and writes its own store file.
    """
    start = time.perf_counter()
    cfg.validate()
    rank, world = shard_of(cfg)
    routings = cfg.routings
    metrics = get_metrics(cfg.metrics)
    specs = expand_methods(cfg.methods, cfg.layers)
    data = []
    for name in dict.fromkeys(cfg.datasets):
        ds = loader(name, cfg.n, cfg.seed)
        data.append(Dataset(ds.name, ds.task, ds.examples[rank::world]))
    summary = Summary(out=shard_path(cfg.out, rank, world))
    with Store(summary.out) as store:  # refuses a foreign file or a store another run writes, before the load
        if lm is None:
            from .models.loading import load_model

            lm = load_model(cfg.model, device=shard_device(cfg.device), dtype=cfg.dtype,
                            device_map=cfg.device_map, load_in_4bit=cfg.load_in_4bit)
        store.check_settings(lm.model_id, run_settings(cfg, metrics, lm))
        pending, totals, summary.skipped = _plan(store, lm.model_id, data, specs, metrics, routings)
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
                bar.advance(tasks[(item.dataset.name, item.spec)])
    summary.seconds = time.perf_counter() - start
    return summary


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
    outputs = []
    for metric, routing in item.needed:
        t0 = time.perf_counter()
        rows = metric.compute(lm, expl, routing, cfg)
        outputs.append(MetricOutput(metric.name, routing, time.perf_counter() - t0, rows))
    store.write(item.unit, text, attribution_s, outputs)
