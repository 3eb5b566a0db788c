"""Grad-ELLM time per example vs the floor (one forward + backward to the input embeddings).

Embedded model, 20 SST-2 sentences from llmattr/data/sst2.jsonl. Target: ratio <= 1.2.
Run: python benchmarks/bench_explain.py [--n 20]
"""

from __future__ import annotations

import argparse
import statistics

import torch

from _common import floor_fn, read_jsonl, timed
from llmattr import load_model, methods
from llmattr.api import prepare
from llmattr.request import Request
from llmattr.tasks import get_task


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.manual_seed(0)
    lm = load_model("default", device="cpu")
    task = get_task("sentiment")
    method = methods.get("grad-ellm")
    method_times, floor_times, lengths = [], [], []
    for text in read_jsonl("sst2", args.n):
        target = prepare(lm, text, Request(task))
        lengths.append(target.input_ids.shape[1])
        floor_times.append(timed(floor_fn(lm, target), args.repeats))
        method_times.append(timed(lambda t=target: method.attribute(lm, t), args.repeats))
    grad_ellm, floor = statistics.median(method_times), statistics.median(floor_times)
    print(f"examples: {args.n}, median prompt length {statistics.median(lengths):.0f} tokens, "
          f"torch threads {torch.get_num_threads()}")
    print(f"floor (1 forward + 1 backward to the embeddings): {floor * 1000:.1f} ms median per example")
    print(f"grad-ellm (all 30 layers):                         {grad_ellm * 1000:.1f} ms median per example")
    print(f"ratio grad-ellm / floor: {grad_ellm / floor:.3f}  (target <= 1.2)")


if __name__ == "__main__":
    main()
