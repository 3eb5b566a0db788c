"""``llmattr evaluate --launcher local|slurm``: the shards of one evaluation submitted as one job array through
submitit. Each job runs shard i of n into its own store file (``results.rank{i}.sqlite``); a preempted or timed-out
job checkpoints by requeueing itself, and the resumable store makes the rerun lossless: it computes only the units
its store does not hold yet (docs/evaluate.md)."""

from __future__ import annotations

import shutil
from dataclasses import dataclass, replace
from pathlib import Path

import submitit

from ..errors import LlmattrError
from .config import EvalConfig
from .loop import Summary, run
from .sharding import check_shards, shard_path

LAUNCHERS = ("none", "local", "slurm")


@dataclass(frozen=True)
class Resources:
    """What each shard's job asks the scheduler for (Slurm only; the local launcher ignores all but ``minutes``)."""

    partition: str | None = None
    gpus: int = 0
    minutes: int = 60
    mem_gb: int | None = None
    account: str | None = None


class ShardJob(submitit.helpers.Checkpointable):
    """One shard of the evaluation as a submitit job. ``checkpoint`` (on preemption or time-out) resubmits the job
    unchanged: the rerun resumes from the shard's store."""

    def __init__(self, cfg: EvalConfig):
        self.cfg = cfg

    def __call__(self) -> Summary:
        return run(self.cfg, progress=False)


def shard_configs(cfg: EvalConfig, shards: int) -> list[EvalConfig]:
    """``cfg`` as shard i of ``shards`` for every i: the same run a user starts with ``--shard i/n``."""
    check_shards(shards, cfg.shard)
    return [replace(cfg, shard=f"{i}/{shards}") for i in range(shards)]


def executor(launcher: str, folder: Path, resources: Resources) -> submitit.Executor:
    """A submitit executor: Slurm's with ``resources`` for ``slurm``, local processes for ``local``. Logs and job
    pickles go to ``folder``."""
    if launcher == "local":
        made = submitit.LocalExecutor(folder=folder)
        made.update_parameters(timeout_min=resources.minutes)
        return made
    if launcher != "slurm":
        raise LlmattrError(f"unknown launcher {launcher!r}; valid: {', '.join(LAUNCHERS)}")
    if shutil.which("srun") is None:
        raise LlmattrError("--launcher slurm submits to Slurm, and srun is not on this machine's PATH: run it on the "
                           "cluster's login node, or use --launcher local")
    made = submitit.AutoExecutor(folder=folder, cluster="slurm")
    given = {"slurm_partition": resources.partition, "mem_gb": resources.mem_gb, "slurm_account": resources.account}
    made.update_parameters(timeout_min=resources.minutes, gpus_per_node=resources.gpus, tasks_per_node=1,
                           name="llmattr-evaluate", **{key: value for key, value in given.items() if value is not None})
    return made


def submit(cfg: EvalConfig, shards: int, launcher: str, folder: Path,
           resources: Resources = Resources()) -> list[submitit.Job]:
    """Submit every shard of ``cfg`` as one job array; returns the jobs (shard i is job i)."""
    configs = shard_configs(cfg, shards)
    made = executor(launcher, folder, resources)
    with made.batch():
        jobs = [made.submit(ShardJob(one)) for one in configs]
    return jobs


def store_pattern(cfg: EvalConfig, shards: int) -> str:
    """The glob of the shards' store files (``results.rank*.sqlite``), for ``llmattr status`` and ``llmattr
    report``."""
    return str(shard_path(cfg.out, 0, shards)).replace(".rank0.", ".rank*.") if shards > 1 else str(cfg.out)
