"""Throughput of the soft-metric evaluator (prefix KV reuse, last-position logits) vs plain batched forwards.

On the embedded model, for the same perturbed sequences of SST-2 examples (short suffix) and IMDb examples
(long suffix, ``--long``):

* evaluator: ``PerturbationEngine.probs`` (pre-span prefix cached once, logits at the last position, chunks
  from its token budget; dynamic routing, so every pass runs in the sdpa kernel);
* plain: ``model(inputs_embeds=full perturbed sequences)`` with full logits, no cache (what naive code does);
* sdpa floor: the same with logits at the last position only, chunked to the same token budget (a plain
  chunked forward of the same sequences through the model's sdpa attention);
* token floor: the same for the tokens the evaluator itself runs (each perturbed sequence from the span on, the
  evaluator's rows per pass), without the prefix they attend to: a plain chunked forward of the same tokens, the
  least any evaluator of these sequences can cost.

Printed as Markdown tables (``benchmarks/compare.py`` reads them): per dataset, sequences/s of each and the ratios
evaluator / token floor (target <= 1.1x, issue 15), evaluator / sdpa floor and evaluator / plain; then the full
per-example evaluation time of pi-Soft-NC/NS (19 pi x 15 samples x NC+NS + zero baseline, dynamic: the pi
search, the masks and the forwards). Usage:
``python benchmarks/bench_soft.py [--examples 10] [--long 2] [--sequences 64] [--full 2]``;
``python benchmarks/compare.py REV_A REV_B benchmarks/bench_soft.py --examples 3 --long 1`` for two revisions.
"""

from __future__ import annotations

import argparse
import time

import torch

from _common import read_jsonl, table
from llmattr.api import prepare
from llmattr.faithfulness.engine import PerturbationEngine
from llmattr.faithfulness.soft import evaluate_target
from llmattr.models.loading import load_model
from llmattr.models.memory import TOKEN_BUDGET
from llmattr.request import Request
from llmattr.tasks import get_task


@torch.no_grad()
def plain_forward(lm, target, keep: torch.Tensor, batch_size: int, last_only: bool, suffix_only: bool = False) -> None:
    """Perturbed sequences through a plain forward, no cache: whole (``suffix_only=False``) or only their tokens from
    the span on, the tokens the evaluator itself runs after its cached prefix (the token floor)."""
    ids = target.input_ids[0, : int(target.positions[0]) + 1]
    a, b = target.span
    first = a if suffix_only else 0
    base = lm.embed(ids[first:])[None]
    for start in range(0, keep.shape[0], batch_size):
        chunk = keep[start: start + batch_size]
        embeds = base.expand(chunk.shape[0], -1, -1).clone()
        embeds[:, a - first: b - first] *= chunk[..., None]
        last = torch.tensor([embeds.shape[1] - 1])  # an index: logits_to_keep=1 would broadcast the LM head
        out = lm.model(inputs_embeds=embeds, use_cache=False, logits_to_keep=last if last_only else 0)
        torch.softmax(out.logits[:, -1].float(), -1)


def timed(fn, *args, **kwargs) -> float:
    start = time.perf_counter()
    fn(*args, **kwargs)
    return time.perf_counter() - start


def compare(lm, targets: list, sequences: int, batch_size: int | None) -> dict[str, float]:
    """Seconds of evaluator, plain, sdpa floor and token floor over ``targets`` (``sequences`` random masks each)."""
    totals = {"evaluator": 0.0, "plain": 0.0, "sdpa floor": 0.0, "token floor": 0.0}
    for target in targets:
        m = target.span[1] - target.span[0]
        keep = torch.bernoulli(torch.full((sequences, m), 0.5))
        engine = PerturbationEngine(lm, target, batch_size=batch_size)  # clean pass not timed
        rows = batch_size or max(1, TOKEN_BUDGET // (int(target.positions[0]) + 1))
        totals["evaluator"] += timed(engine.probs, keep)
        totals["plain"] += timed(plain_forward, lm, target, keep, rows, last_only=False)
        totals["sdpa floor"] += timed(plain_forward, lm, target, keep, rows, last_only=True)
        totals["token floor"] += timed(plain_forward, lm, target, keep, engine.batch_size, last_only=True,
                                       suffix_only=True)
    return totals


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=10, help="SST-2 examples")
    parser.add_argument("--long", type=int, default=2, help="IMDb examples (long suffix)")
    parser.add_argument("--sequences", type=int, default=64, help="perturbed sequences per example")
    parser.add_argument("--batch-size", type=int, default=None, help="default: the evaluator's token budget")
    parser.add_argument("--full", type=int, default=2, help="SST-2 examples timed with the full evaluation")
    args = parser.parse_args()
    torch.manual_seed(0)
    lm = load_model("default", device="cpu")
    task = get_task("sentiment")
    print(f"{torch.get_num_threads()} threads, {args.sequences} perturbed sequences per example, "
          f"batch {args.batch_size or f'from {TOKEN_BUDGET} suffix tokens per pass'}")
    sets = {"SST-2": [prepare(lm, text, Request(task)) for text in read_jsonl("sst2", args.examples)],
            "IMDb": [prepare(lm, text, Request(task)) for text in read_jsonl("imdb", args.long)]}
    rows = []
    for name, targets in sets.items():
        if not targets:
            continue
        suffix = sum(t.prompt_len - t.span[0] for t in targets) / len(targets)
        totals = compare(lm, targets, args.sequences, args.batch_size)
        n_seq = args.sequences * len(targets)
        rows.append((f"{name} ({len(targets)} ex., suffix {suffix:.0f})",
                     *(f"{n_seq / seconds:.1f}" for seconds in totals.values()),
                     *(f"{totals['evaluator'] / totals[key]:.2f}x" for key in ("token floor", "sdpa floor", "plain"))))
    print("\nSequences/s, and the evaluator's time over each other's (target: <= 1.1x the token floor)\n")
    print(table(rows, ("set", "evaluator", "plain", "sdpa floor", "token floor", "/ token floor", "/ sdpa floor",
                       "/ plain")))
    full = []
    for i, target in enumerate(sets["SST-2"][: args.full]):
        scores = torch.rand(1, target.span[1] - target.span[0])
        full.append((f"SST-2 example {i + 1}", target.prompt_len - target.span[0],
                     f"{timed(evaluate_target, lm, target, scores, [0]):.2f}"))
    if full:
        print("\nFull evaluation: pi-Soft-NC/NS, 19 pi x 15 samples x NC+NS + zero baseline = 601 sequences, dynamic\n")
        print(table(full, ("example", "suffix tokens", "s/example")))


if __name__ == "__main__":
    main()
