"""The configuration of ``llmattr evaluate``: CLI options and TOML file keys, validated before any load."""

from __future__ import annotations

import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import MISSING, dataclass, field, fields, replace
from pathlib import Path

from ..checks import (
    DATA_TASK,
    ROUTINGS,
    SCOPES,
    TARGET_MODES,
    dtype_name,
    examples_wanted,
    member,
    one_of,
    one_source,
    positive_int,
    split_list,
    writable_file,
)
from ..declarations import asked
from ..errors import LlmattrError
from ..faithfulness.registry import MetricOptions, declared_options
from ..sizes import parse_max_memory


@dataclass
class EvalConfig:
    """Everything ``llmattr evaluate`` needs; the CLI options and the TOML config file hold the same keys. An
    option a registered metric declares (:class:`~llmattr.faithfulness.registry.Option`: the soft metrics'
    ``samples``, ``step_stride`` and ``coupling``, the ranking metrics' ``removal``, a plugin's own) is a key and a
    keyword too (``EvalConfig(samples=2)``), kept in ``options``."""

    model: str = asked("default", "'default' (SmolLM2-135M-Instruct), 'gemma-3-270m', a hub id, a folder or a .gguf.",
                       str)
    datasets: list[str] | None = asked(None, "Comma-separated datasets, e.g. sst2,imdb,boolq, or blimp (its five "
                                             "paradigms); default sst2.", str)  # None: DEFAULT_DATASETS, or --data's
    methods: list[str] = asked(help="Comma-separated methods; parameters as name:key=value (e.g. "
                                    "grad-ellm:attention=softmax). Default grad-ellm.", option=str,
                               default_factory=lambda: ["grad-ellm"])
    metrics: list[str] = asked(help="Comma-separated metrics, e.g. pi-soft,soft,deletion-insertion (default "
                                    "pi-soft).", option=str, default_factory=lambda: ["pi-soft"])
    routing: str = asked("dynamic", "Soft-metric protocol: dynamic (default), fixed or both.", str)
    n: int | str | None = asked(None, "Examples per dataset, or all (every row). Default: 50 of a shipped dataset, "
                                      "balanced per class; every row of --data. Under torchrun write -n or --examples "
                                      "(torchrun takes --n for its own --nnodes).", str, "--n", "-n", "--examples")
    seed: int = asked(0, "Seed of example sampling, attributions and perturbations (default 0).", int)
    layers: list[str] | None = asked(None, "Sweep of the parameter a method names as its layer sweep (Grad-ELLM: the "
                                           "number of aggregated layers), e.g. 1,4,8,16,all.", str)
    max_new_tokens: int | None = asked(None, "Tokens to generate and explain (task default if unset).", int)
    target: str = asked("label", "Tasks with label words: explain the predicted label word (label, default), the "
                                 "free greedy answer (generated) or the gold label (gold).", str)
    scope: str = asked("span", "What is attributed, perturbed and zeroed: span (default), prompt (every prompt "
                               "token: paper 000's pipeline) or all (+ generated prefix).", str)
    out: str = asked("results.sqlite", "Results store (default results.sqlite; shard i writes "
                                       "results.rank{i}.sqlite).", Path)
    shard: str | None = asked(None, "Take shard i of n of every dataset, as i/n (default: RANK/WORLD_SIZE of "
                                    "torchrun/accelerate, else the Slurm task's, else 0/1).", str)
    device: str = asked("auto", "cpu, cuda, cuda:N or auto (default auto; when sharded, the GPU of LOCAL_RANK, else "
                                "of SLURM_LOCALID).", str)
    dtype: str | None = asked(None, "float32, bfloat16, float16 or auto.", str)
    device_map: str | None = asked(None, "'auto' spreads a big model over the GPUs (accelerate).", str)
    max_memory: str | None = asked(None, "Memory per device for --device-map, e.g. cpu=2GB,0=20GB (the rest is "
                                         "offloaded to disk).", str)
    load_in_4bit: bool = asked(False, "4-bit weights (bitsandbytes).", bool, "--load-in-4bit/--no-load-in-4bit")
    data: str | None = asked(None, "Your own JSONL/CSV/TSV file instead of --datasets (named by its stem).", Path)
    task: str = asked(DATA_TASK, "--data: the task that prompts its rows (default sentiment).", str)
    text_field: str | None = asked(None, "--data: the column holding the text (default: the task's field).", str)
    label_field: str | None = asked(None, "--data: the column holding the label (default: label).", str)
    labels: str | None = asked(None, "--data: label words, e.g. Positive,Negative, or file value=word pairs, e.g. "
                                     "0=Negative,1=Positive (default: the task's).", str)
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


def read_toml(path: str | Path) -> dict:
    """The keys of ``llmattr evaluate --config``'s TOML file, refused in one line when it is missing or not TOML."""
    try:
        with open(path, "rb") as handle:
            return tomllib.load(handle)
    except FileNotFoundError as err:
        raise LlmattrError(f"config file not found: {path}") from err
    except tomllib.TOMLDecodeError as err:
        raise LlmattrError(f"{path} is not valid TOML: {err}") from err


def config_values(data: Mapping, keys: Iterable[str]) -> dict:
    """``llmattr evaluate``'s settings from a TOML file or the command line: names with ``_`` (``max-new-tokens``
    is ``max_new_tokens``), unset (None) values left out, lists given as ``a,b`` split; a name that is none of
    ``keys`` refused, listing them."""
    keys = sorted(keys)
    data = {key.replace("-", "_"): value for key, value in data.items() if value is not None}
    unknown = sorted(set(data) - set(keys))
    if unknown:
        raise LlmattrError(f"unknown config key(s) {', '.join(unknown)}; valid: {', '.join(keys)}")
    for key in ("datasets", "methods", "metrics", "layers"):
        if isinstance(data.get(key), str | int):
            data[key] = split_list(str(data[key]))
    return data


def check_evaluation(values: Mapping) -> None:
    """``llmattr evaluate``'s settings that need no registry (a key left out is unset): ``n``, ``data`` beside
    ``datasets``, ``max_new_tokens``, ``seed``, ``target`` and ``scope``."""
    examples_wanted(values.get("n"))
    one_source(values.get("data"), values.get("datasets"))
    if values.get("max_new_tokens") is not None:
        positive_int(values["max_new_tokens"], "--max-new-tokens")
    seed = values.get("seed", 0)
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise LlmattrError(f"--seed must be a whole number, got {seed!r}")
    for key, valid in (("target", TARGET_MODES), ("scope", SCOPES)):
        if key in values:
            member(values[key], valid, key)
