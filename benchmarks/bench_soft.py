"""Throughput of the soft-metric evaluator (prefix KV reuse, last-position logits) vs a plain batched forward.

On the embedded model and SST-2 examples, for the same perturbed sequences and the same batch size:

* evaluator: ``PerturbationEngine.probs`` (pre-span prefix cached once, logits at the last position);
* plain: ``model(inputs_embeds=full perturbed sequences)`` with full logits, no cache (what naive code does);
* plain-last: the same but with logits at the last position only (isolates the gain of prefix reuse).

Then the full per-example evaluation time of pi-Soft-NC/NS (19 pi x 15 samples x NC+NS + zero baseline,
dynamic routing). Usage: ``python benchmarks/bench_soft.py [--examples 10] [--sequences 64] [--full 2]``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from llmattr.api import prepare
from llmattr.faithfulness.engine import PerturbationEngine
from llmattr.faithfulness.soft import evaluate_target
from llmattr.models.loading import load_model
from llmattr.tasks import get_task

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"


def sst2(n: int) -> list[str]:
    lines = (DATA / "sst2.jsonl").read_text().splitlines()[:n]
    return [json.loads(line)["text"] for line in lines]


@torch.no_grad()
def plain_forward(lm, target, keep: torch.Tensor, batch_size: int, last_only: bool) -> None:
    """Full perturbed sequences, no cache; the baseline the evaluator is compared with."""
    ids = target.input_ids[0, : int(target.positions[0]) + 1]
    a, b = target.span
    base = lm.embed(ids)[None]
    for start in range(0, keep.shape[0], batch_size):
        chunk = keep[start: start + batch_size]
        embeds = base.expand(chunk.shape[0], -1, -1).clone()
        embeds[:, a:b] *= chunk[..., None]
        out = lm.model(inputs_embeds=embeds, use_cache=False, logits_to_keep=1 if last_only else 0)
        torch.softmax(out.logits[:, -1].float(), -1)


def timed(fn, *args, **kwargs) -> float:
    start = time.perf_counter()
    fn(*args, **kwargs)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=10)
    parser.add_argument("--sequences", type=int, default=64, help="perturbed sequences per example")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--full", type=int, default=2, help="examples timed with the full evaluation")
    args = parser.parse_args()
    torch.manual_seed(0)
    lm = load_model("default", device="cpu")
    task = get_task("sentiment")
    targets = [prepare(lm, text, task) for text in sst2(args.examples)]
    totals = {"evaluator": 0.0, "plain": 0.0, "plain-last": 0.0}
    n_seq, prefix, length = 0, 0, 0
    for target in targets:
        m = target.span[1] - target.span[0]
        keep = torch.bernoulli(torch.full((args.sequences, m), 0.5))
        engine = PerturbationEngine(lm, target, batch_size=args.batch_size)  # clean pass not timed
        totals["evaluator"] += timed(engine.probs, keep)
        totals["plain"] += timed(plain_forward, lm, target, keep, args.batch_size, last_only=False)
        totals["plain-last"] += timed(plain_forward, lm, target, keep, args.batch_size, last_only=True)
        n_seq += args.sequences
        prefix += target.span[0]
        length += target.prompt_len
    print(f"{args.examples} SST-2 examples, {n_seq} perturbed sequences, batch size {args.batch_size}, "
          f"pre-span prefix {prefix / length:.0%} of the prompt tokens, {torch.get_num_threads()} threads")
    for name, seconds in totals.items():
        print(f"  {name:10s} {n_seq / seconds:8.1f} sequences/s")
    print(f"  ratio evaluator / plain      {totals['plain'] / totals['evaluator']:.2f}x")
    print(f"  ratio evaluator / plain-last {totals['plain-last'] / totals['evaluator']:.2f}x")
    for target in targets[: args.full]:
        scores = torch.rand(1, target.span[1] - target.span[0])
        seconds = timed(evaluate_target, lm, target, scores, [0])
        print(f"full evaluation (19 pi x 15 samples x NC+NS + zero baseline = 601 sequences of "
              f"{target.prompt_len - target.span[0]} suffix tokens, dynamic): {seconds:.1f} s/example")


if __name__ == "__main__":
    main()
