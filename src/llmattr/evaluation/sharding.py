"""Sharding of ``llmattr evaluate`` over processes: ``--shard i/n``, torchrun/accelerate's environment, or Slurm's
(``srun`` tasks, job array tasks, or an array of ``srun`` steps); and which examples each shard takes
(:func:`shard_examples`: balanced by estimated cost, or ``i::n`` in a store written before balancing)."""

from __future__ import annotations

import heapq
import os
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

from ..errors import LlmattrError
from ..lazy import torch
from ..tasks import Task
from .config import EvalConfig
from .run_datasets import Dataset

BALANCED, STRIDED = "balanced", "i::n"  # the shard rules; a store that records none was written with i::n


def shard_of(cfg: EvalConfig) -> tuple[int, int]:
    """(rank, world size): ``--shard i/n`` first, then torchrun/accelerate's RANK and WORLD_SIZE, then Slurm's
    environment (:func:`slurm_shard`), else (0, 1)."""
    if cfg.shard:
        rank, world = parse_shard(cfg.shard)
    elif "WORLD_SIZE" in os.environ:
        rank, world = int(os.environ.get("RANK", 0)), int(os.environ["WORLD_SIZE"])
    else:
        rank, world = slurm_shard(os.environ)
    return check_shard(rank, world)


def slurm_shard(env: Mapping[str, str]) -> tuple[int, int]:
    """(rank, world size) of this process in a Slurm job: the array task's place times the step's tasks plus the
    task's ``SLURM_PROCID``. The step's tasks are ``SLURM_STEP_NUM_TASKS`` (set by ``srun``), else ``SLURM_NTASKS``;
    the array task's place is ``(SLURM_ARRAY_TASK_ID - MIN) / STEP`` of ``SLURM_ARRAY_TASK_COUNT`` (else
    ``(MAX - MIN) / STEP + 1``), so ``--array=1-8`` and ``--array=0-14:2`` count from 0 too. Outside Slurm: (0, 1)."""
    tasks = int(env.get("SLURM_STEP_NUM_TASKS", env.get("SLURM_NTASKS", 1)))
    task = int(env.get("SLURM_PROCID", 0)) if tasks > 1 else 0
    if "SLURM_ARRAY_TASK_ID" not in env:
        return task, tasks
    first, step = int(env.get("SLURM_ARRAY_TASK_MIN", 0)), int(env.get("SLURM_ARRAY_TASK_STEP", 1))
    if "SLURM_ARRAY_TASK_COUNT" in env:
        count = int(env["SLURM_ARRAY_TASK_COUNT"])
    elif "SLURM_ARRAY_TASK_MAX" in env:
        count = (int(env["SLURM_ARRAY_TASK_MAX"]) - first) // step + 1
    else:
        raise LlmattrError("SLURM_ARRAY_TASK_ID is set without SLURM_ARRAY_TASK_COUNT or SLURM_ARRAY_TASK_MAX: "
                           "give --shard i/n")
    place, off_grid = divmod(int(env["SLURM_ARRAY_TASK_ID"]) - first, step)
    if off_grid or not 0 <= place < count:
        raise LlmattrError(f"array task {env['SLURM_ARRAY_TASK_ID']} is not on the array's grid (min {first}, step "
                           f"{step}, {count} tasks): submit --array=0-{count - 1}, or give --shard i/n")
    return place * tasks + task, count * tasks


def shard_path(out: str | Path, rank: int, world: int) -> Path:
    """``results.sqlite`` for one process, ``results.rank{i}.sqlite`` for shard i of several."""
    out = Path(out)
    return out if world == 1 else out.with_name(f"{out.stem}.rank{rank}{out.suffix or '.sqlite'}")


def shard_device(device: str, env: Mapping[str, str] = os.environ) -> str:
    """With ``device="auto"``, each process of a host takes its own GPU: its local rank on the host (torchrun and
    accelerate's ``LOCAL_RANK``, else Slurm's ``SLURM_LOCALID``) modulo the GPUs it sees, so ``srun`` tasks that
    share a node's GPUs spread over them and a task that Slurm bound to one GPU (it sees one) takes it."""
    local = env.get("LOCAL_RANK", env.get("SLURM_LOCALID"))
    if device == "auto" and local is not None and torch.cuda.is_available():
        return f"cuda:{int(local) % torch.cuda.device_count()}"
    return device


def shard_rule(stored: Mapping | None) -> str:
    """The rule that gives this store its examples: the one its settings record (``shards``); a store written
    before the rule was recorded took ``i::n``; a new store (no settings yet) is :data:`BALANCED`."""
    return BALANCED if stored is None else stored.get("shards", STRIDED)


def rule_setting(rule: str) -> dict:
    """The rule as recorded in the store's settings: ``{"shards": rule}``; nothing for ``i::n``, so a store written
    before balancing keeps the settings it has (and resumes, and merges, as it was written)."""
    return {} if rule == STRIDED else {"shards": rule}


def example_cost(task: Task, example: dict) -> int:
    """An example's estimated cost: the characters of its user message (the tokens it will have, known before
    any tokenizer loads and from no library's version). Every method and metric of the run runs on every example
    of a shard, so their cost classes multiply every example's cost alike and leave the assignment unchanged."""
    return len(task.user_content(example)[0])


def balanced_owners(data: list[Dataset], world: int) -> dict[tuple[str, str], int]:
    """Shard of each (dataset, example id): longest processing time first (Graham 1969), examples sorted by
    :func:`example_cost` descending (ties by dataset and id), each to the shard with the least cost so far (ties:
    the lowest rank). Every shard computes the same owners from the same examples, with no coordination."""
    ranked = sorted(((example_cost(ds.task, ex), ds.name, str(ex["id"])) for ds in data for ex in ds.examples),
                    key=lambda item: (-item[0], item[1], item[2]))
    loads = [(0, shard) for shard in range(world)]
    owners = {}
    for cost, dataset, example in ranked:
        load, shard = heapq.heappop(loads)
        owners[(dataset, example)] = shard
        heapq.heappush(loads, (load + cost, shard))
    return owners


def shard_examples(data: list[Dataset], rank: int, world: int, rule: str = BALANCED) -> list[Dataset]:
    """Each dataset with the examples shard ``rank`` of ``world`` evaluates, in their order: under ``rule``
    :data:`BALANCED` those :func:`balanced_owners` gives it, under :data:`STRIDED` (``i::n``) every ``world``-th
    from the ``rank``-th."""
    if rule == STRIDED:
        return [replace(ds, examples=ds.examples[rank::world]) for ds in data]
    owners = balanced_owners(data, world)
    return [replace(ds, examples=[ex for ex in ds.examples if owners[(ds.name, str(ex["id"]))] == rank])
            for ds in data]


def parse_shard(text: str) -> tuple[int, int]:
    """``--shard i/n`` as (rank, world size), refused in one line when it is not two whole numbers."""
    try:
        rank, world = (int(part) for part in text.split("/"))
    except ValueError as err:
        raise LlmattrError(f"--shard expects i/n (e.g. 0/2), got {text!r}") from err
    return rank, world


def check_shard(rank: int, world: int) -> tuple[int, int]:
    """(rank, world size) if ``0 <= rank < world``, else one line."""
    if world < 1 or not 0 <= rank < world:
        raise LlmattrError(f"shard {rank}/{world} is out of range: use i/n with 0 <= i < n")
    return rank, world


def check_shards(shards: int, shard: str | None) -> None:
    """Refuse ``--shards`` (a launcher's shard count) below 1, or beside ``--shard`` (one shard run by hand)."""
    if shards < 1:
        raise LlmattrError(f"--shards must be at least 1, got {shards}")
    if shard:
        raise LlmattrError(f"--shard {shard} runs one shard yourself; the launcher runs them all: give --shards "
                           "n instead")
