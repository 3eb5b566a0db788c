"""The configuration of ``llmattr evaluate``: CLI options and TOML file keys, validated before any load."""

from __future__ import annotations

from dataclasses import MISSING, dataclass, field, fields, replace
from pathlib import Path

from ..checks import (
    DATA_TASK,
    ROUTINGS,
    dtype_name,
    examples_wanted,
    one_of,
    writable_file,
)
from ..faithfulness.registry import MetricOptions, declared_options
from ..model_free import check_evaluation, config_values, read_toml
from ..sizes import parse_max_memory


@dataclass
class EvalConfig:
    """Everything ``llmattr evaluate`` needs; the CLI options and the TOML config file hold the same keys. An
    option a registered metric declares (:class:`~llmattr.faithfulness.registry.Option`: the soft metrics'
    ``samples``, ``step_stride`` and ``coupling``, the ranking metrics' ``removal``, a plugin's own) is a key and a
    keyword too (``EvalConfig(samples=2)``), kept in ``options``."""

    model: str = "default"
    datasets: list[str] | None = None  # None: DEFAULT_DATASETS, or --data's file alone
    methods: list[str] = field(default_factory=lambda: ["grad-ellm"])
    metrics: list[str] = field(default_factory=lambda: ["pi-soft"])
    routing: str = "dynamic"
    n: int | str | None = None  # examples per dataset; None: DEFAULT_N of a shipped dataset, every row of --data
    seed: int = 0
    layers: list[str] | None = None
    max_new_tokens: int | None = None
    target: str = "label"
    scope: str = "span"
    out: str = "results.sqlite"
    shard: str | None = None
    device: str = "auto"
    dtype: str | None = None
    device_map: str | None = None
    max_memory: str | None = None
    load_in_4bit: bool = False
    data: str | None = None  # the user's own JSONL/CSV file instead of --datasets (docs/evaluate.md)
    task: str = DATA_TASK  # --data: the task that prompts its rows
    text_field: str | None = None
    label_field: str | None = None
    labels: str | None = None
    options: dict = field(default_factory=dict)  # values of the options the metrics declare (registry.Option)

    def __init__(self, **values):
        """Every field at its default but those in ``values``; a keyword naming an option a metric declares
        (``samples=2``) is kept in ``options``, over the ones given there."""
        declared = {key: values.pop(key) for key in list(values) if key in declared_options() and key not in FIELDS}
        unknown = sorted(set(values) - FIELDS)
        if unknown:
            raise TypeError(f"EvalConfig got unknown keyword(s) {', '.join(unknown)}")
        for f in fields(EvalConfig):
            setattr(self, f.name, values[f.name] if f.name in values
                    else f.default_factory() if f.default is MISSING else f.default)
        self.options = {**self.options, **declared}

    @classmethod
    def from_mapping(cls, data: dict, base: EvalConfig | None = None) -> EvalConfig:
        """A config from a dict (TOML file or CLI values); ``None`` values keep ``base``'s."""
        data = config_values(data, [*(FIELDS - {"options"}), *declared_options()])
        return replace(base or cls(), **data)

    @classmethod
    def from_toml(cls, path: str | Path) -> EvalConfig:
        return cls.from_mapping(read_toml(path))

    def validate(self) -> None:
        """Refuse bad values before the model loads and before anything is stored."""
        check_evaluation(vars(self))
        self.n = examples_wanted(self.n)
        declared = declared_options()
        self.options = {name: declared[name].check(value) for name, value in self.options.items()}
        parse_max_memory(self.max_memory)
        dtype_name(self.dtype)
        writable_file(self.out, "--out")

    def dataset_names(self) -> list[str]:
        """``--datasets``, else :data:`DEFAULT_DATASETS` (a run with ``--data`` evaluates its file instead)."""
        return self.datasets or list(DEFAULT_DATASETS)

    def sample_size(self) -> int | None:
        """Examples per dataset (None: every row): ``--n``; ``all``; without ``--n``, :data:`DEFAULT_N` balanced
        per class of a shipped dataset and every row of the user's own ``--data`` file."""
        if self.n == "all" or (self.n is None and self.data is not None):
            return None
        return DEFAULT_N if self.n is None else self.n

    @property
    def routings(self) -> tuple[str, ...]:
        if self.routing == "both":
            return ROUTINGS
        return (one_of(self.routing, (*ROUTINGS, "both"), "routing"),)

    def metric_options(self) -> MetricOptions:
        """The options the metrics read (:class:`~llmattr.faithfulness.registry.MetricOptions`)."""
        return MetricOptions(seed=self.seed, values=dict(self.options))

    def option(self, name: str) -> object:
        """A setting by name: a field, or a metric's declared option (its default where not given)."""
        if name in self.options:
            return self.options[name]
        return getattr(self, name) if hasattr(self, name) else declared_options()[name].default


FIELDS = {f.name for f in fields(EvalConfig)}
DEFAULT_DATASETS = ("sst2",)
DEFAULT_N = 50  # examples per shipped dataset, balanced per class (paper 000 appendix C)
