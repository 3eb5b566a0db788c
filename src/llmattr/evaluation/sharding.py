"""Sharding of ``llmattr evaluate`` over processes: ``--shard i/n`` or torchrun/accelerate's environment."""

from __future__ import annotations

import os
from pathlib import Path

import torch

from ..errors import LlmattrError
from .config import EvalConfig


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
