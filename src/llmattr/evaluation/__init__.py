"""``llmattr evaluate``: config, method specs, sharding, datasets and the loop (docs/evaluate.md)."""

from ..checks import split_list
from .config import EvalConfig
from .loop import Plan, Summary, plan, run, run_settings
from .method_specs import MethodSpec, expand_methods, parse_method
from .run_datasets import Dataset, DatasetLoader, dataset_names, load_dataset
from .sharding import shard_device, shard_of, shard_path

__all__ = ["Dataset", "DatasetLoader", "EvalConfig", "MethodSpec", "Plan", "Summary", "dataset_names", "expand_methods",
           "load_dataset", "parse_method", "plan", "run", "run_settings", "shard_device", "shard_of", "shard_path",
           "split_list"]
