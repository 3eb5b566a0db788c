"""Shared benchmark helpers: data location, timing, and the single-gradient floor."""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

import torch

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"


def read_jsonl(name: str, n: int, field: str = "text") -> list[str]:
    """The first ``n`` values of ``field`` in ``../shared/data/<name>.jsonl``."""
    with open(DATA / f"{name}.jsonl") as handle:
        return [json.loads(line)[field] for _, line in zip(range(n), handle, strict=False)]


def timed(fn, repeats: int = 3) -> float:
    """Median wall time of ``fn()`` over ``repeats`` calls (after one warm-up call)."""
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def floor_fn(lm, target):
    """One plain forward + backward to the input embeddings for the first explained token (the floor)."""
    def run():
        embeds = lm.embed(target.input_ids).detach().requires_grad_(True)
        logits = lm.model(inputs_embeds=embeds, logits_to_keep=1, use_cache=False).logits
        (grad,) = torch.autograd.grad(logits[0, -1, target.target_ids[-1]], embeds)
        return grad
    return run
