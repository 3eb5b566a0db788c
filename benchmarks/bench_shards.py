"""Balanced shards against ``i::n``: the slowest shard over the mean shard, in estimated cost and in measured time.

A mix of ``--n`` SST-2 sentences and ``--n`` IMDb reviews (the default sample of each, seed 0) split into
``--shards`` shards by each rule (:func:`llmattr.evaluation.sharding.shard_examples`); each shard is then evaluated
by the evaluation loop (``llmattr.evaluation.run``, one shard after the other in this process, each into its own
store) with the embedded model on the CPU, ``--methods`` and ``--metrics``. The goal is a slowest shard at most
1.15 x the mean. Times are wall times on whatever else the machine runs: the load average is printed with them.
Run: python benchmarks/bench_shards.py [--n 12 --shards 4 --methods saliency --metrics soft]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import torch

from _common import table
from llmattr import load_model
from llmattr.evaluation import EvalConfig, load_dataset, run
from llmattr.evaluation.sharding import BALANCED, STRIDED, example_cost, shard_examples


def over_mean(values: list[float]) -> float:
    """The largest value over the mean."""
    return max(values) / (sum(values) / len(values))


def evaluate_shard(lm, shard: list, out: Path, args) -> float:
    """Seconds the evaluation loop takes on one shard's examples (a fresh store)."""
    chosen = {ds.name: ds for ds in shard}
    cfg = EvalConfig(datasets=list(chosen), methods=args.methods.split(","), metrics=args.metrics.split(","),
                     n=args.n, device="cpu", out=str(out))
    start = time.perf_counter()
    summary = run(cfg, lm=lm, loader=lambda name, n, seed, **_: chosen[name], progress=False)
    assert not summary.failed, summary.failed
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=12, help="examples of each dataset")
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--methods", default="saliency")
    parser.add_argument("--metrics", default="soft")
    args = parser.parse_args()
    torch.manual_seed(0)
    lm = load_model("default", device="cpu")
    data = [load_dataset("sst2", args.n, 0), load_dataset("imdb", args.n, 0)]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        warm = [replace(ds, examples=ds.examples[:1]) for ds in data]
        evaluate_shard(lm, warm, Path(tmp) / "warm-up.sqlite", args)
        for rule in (STRIDED, BALANCED):
            shards = [shard_examples(data, rank, args.shards, rule) for rank in range(args.shards)]
            cost = [sum(example_cost(ds.task, ex) for ds in shard for ex in ds.examples) for shard in shards]
            seconds = [evaluate_shard(lm, shard, Path(tmp) / f"{rule.replace(':', '')}{rank}.sqlite", args)
                       for rank, shard in enumerate(shards)]
            rows.append((rule, f"{over_mean(cost):.3f}", f"{over_mean(seconds):.3f}",
                         " / ".join(f"{s:.1f}" for s in seconds)))
    print(f"{args.n} SST-2 + {args.n} IMDb examples, {args.shards} shards, {args.methods} x {args.metrics}, "
          f"embedded model on the CPU; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores\n")
    print(table(rows, ("assignment", "slowest / mean, estimated cost", "slowest / mean, measured time",
                       "seconds per shard")))


if __name__ == "__main__":
    main()
