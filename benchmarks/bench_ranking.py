"""Per-example time of deletion/insertion (paper 000 appendix E): batched vs a loop of single forwards.

On the embedded model and SST-2 examples (grad-ellm scores), both ways compute the same 42 perturbed
distributions (21 deletion + 21 insertion points, zeroed embeddings):

* batched: :func:`llmattr.faithfulness.ranking.ranking_metrics` machinery (one ``PerturbationEngine``
  call: prefix KV cache computed once, all masks in one batch, logits at the last position);
* loop: one plain forward per perturbed input (``model(inputs_embeds=...)``, batch of 1, full prompt).

Prints both times per example, their ratio (target >= 3x) and the largest probability difference.
Usage: ``python benchmarks/bench_ranking.py [--examples 5]``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from llmattr.api import prepare
from llmattr.faithfulness.ranking import DI_STEPS, Perturbed, counts, top_masks
from llmattr.methods import get as get_method
from llmattr.models.loading import load_model
from llmattr.request import Request
from llmattr.tasks import get_task

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"


def di_masks(scores: torch.Tensor) -> torch.Tensor:
    """The 42 keep masks of deletion (top tokens zeroed) and insertion (only top tokens kept)."""
    fractions = torch.linspace(0, 1, DI_STEPS + 1).tolist()
    top = top_masks(scores, counts(fractions, scores.numel()))
    return torch.cat([~top, top]).float()


@torch.no_grad()
def loop_probs(lm, target, keep: torch.Tensor) -> torch.Tensor:
    """Baseline: one full forward per perturbed input."""
    ids = target.prompt.input_ids
    a, b = target.span
    embeds = lm.embed(ids)
    out = []
    for row in keep:
        x = embeds.clone()
        x[0, a:b] *= row[:, None]
        out.append(torch.softmax(lm.model(inputs_embeds=x, use_cache=False).logits[0, -1].float(), -1))
    return torch.stack(out)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--examples", type=int, default=5)
    args = parser.parse_args()
    lm = load_model("default", device="cpu")
    task = get_task("sst2")
    with open(DATA / "sst2.jsonl") as handle:
        texts = [json.loads(line)["text"] for _, line in zip(range(args.examples), handle, strict=False)]
    method = get_method("grad-ellm")
    ratios = []
    for text in texts:
        target = prepare(lm, text, Request(task, answer="Positive"))
        keep = di_masks(method.attribute(lm, target)[0])
        start = time.perf_counter()
        batched = Perturbed(lm, target).probs(keep)
        t_batched = time.perf_counter() - start
        start = time.perf_counter()
        looped = loop_probs(lm, target, keep)
        t_loop = time.perf_counter() - start
        ratios.append(t_loop / t_batched)
        print(f"{target.span[1] - target.span[0]:3d} content tokens, {target.prompt_len} prompt tokens: "
              f"batched {t_batched:.2f} s, loop {t_loop:.2f} s, x{ratios[-1]:.1f}, "
              f"max |dp| {float((batched - looped).abs().max()):.1e}", flush=True)
    print(f"median speed-up of batched deletion/insertion over a loop of single forwards: "
          f"x{statistics.median(ratios):.1f} (target >= 3x)")


if __name__ == "__main__":
    main()
