"""Paper 003's Table 2: seconds per instance by input length, NormXLogit against the gradient methods, on a model
with a sequence head (``llmattr finetune --head``), in one run.

    python benchmarks/bench_head.py --model sst2-head-dir [--lengths 40,120,360,512] [--repeats 5] [--out t2.json]

Each input is ``length`` token ids drawn (seeded) from the vocabulary's ordinary tokens; each method
(:func:`llmattr.faithfulness.head.head_attribution`: NormXLogit, Grad. Norm, G x I, IG with 25 steps) runs once as a
warm-up and then ``--repeats`` times; the table gives the mean and standard deviation of the wall time and, per
length, each method's time divided by NormXLogit's from the same run (the ratio a shared machine distorts least),
with the load average before and after (a shared machine slows every method). Small arguments for a check:
``--lengths 8,16 --repeats 1``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import torch

from llmattr.faithfulness.head import head_attribution
from llmattr.models.loading import load_model

METHODS = ("saliency", "input-x-gradient", "integrated-gradients", "normxlogit")
NAMES = {"saliency": "Gradient Norm", "input-x-gradient": "Gradient x Input", "integrated-gradients":
         "Integrated Gradients", "normxlogit": "NormXLogit"}


def inputs(tokenizer, length: int, seed: int) -> torch.Tensor:
    """``(1, length)`` token ids drawn from the non-special tokens."""
    special = set(tokenizer.all_special_ids)
    pool = torch.tensor([i for i in range(len(tokenizer)) if i not in special])
    pick = torch.randint(len(pool), (length,), generator=torch.Generator().manual_seed(seed))
    return pool[pick][None]


def ratios(cells: dict[str, tuple[float, float]]) -> dict[str, float]:
    """Each method's mean seconds divided by NormXLogit's at the same length, from the same run."""
    return {method: mean / cells["normxlogit"][0] for method, (mean, _) in cells.items()}


def table(rows: dict[int, dict[str, tuple[float, float]]], methods: list[str]) -> list[str]:
    """Markdown lines: seconds per instance (mean ± sd) by input length, then each method's ratio to NormXLogit."""
    names = [NAMES.get(m, m) for m in methods]
    lines = ["| input length | " + " | ".join(names) + " | " + " | ".join(f"{n} / NormXLogit" for n in names) + " |",
             "|---" * (2 * len(methods) + 1) + "|"]
    for length, cells in rows.items():
        lines.append(f"| {length} | " + " | ".join(f"{m:.3f} ± {s:.3f}" for m, s in cells.values()) + " | "
                     + " | ".join(f"{r:.2f}x" for r in ratios(cells).values()) + " |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True, help="a folder written by llmattr finetune --head")
    parser.add_argument("--lengths", default="40,120,360,512")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--out")
    args = parser.parse_args()
    methods = args.methods.split(",")
    if "normxlogit" not in methods:
        parser.error("--methods must include normxlogit (the ratios' denominator)")
    lm = load_model(args.model, device="cpu")
    load_before = os.getloadavg()[0]
    rows = {}
    for length in map(int, args.lengths.split(",")):
        ids = inputs(lm.tokenizer, length, length).to(lm.device)
        rows[length] = {}
        for method in methods:
            head_attribution(lm.model, ids, method)  # warm-up
            times = []
            for _ in range(args.repeats):
                start = time.perf_counter()
                head_attribution(lm.model, ids, method)
                times.append(time.perf_counter() - start)
            rows[length][method] = (statistics.mean(times), statistics.stdev(times) if len(times) > 1 else 0.0)
    load_after = os.getloadavg()[0]
    print("\n".join(table(rows, methods)))
    print(f"seconds per instance, {args.repeats} repeats after a warm-up, {torch.get_num_threads()} torch threads; "
          f"load average {load_before:.1f} before, {load_after:.1f} after")
    if args.out:
        Path(args.out).write_text(json.dumps({"model": args.model, "repeats": args.repeats, "rows": rows,
                                              "ratios": {length: ratios(cells) for length, cells in rows.items()},
                                              "threads": torch.get_num_threads(), "load_before": load_before,
                                              "load_after": load_after}, indent=1))


if __name__ == "__main__":
    main()
