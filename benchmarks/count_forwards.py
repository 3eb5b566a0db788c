"""Forward rows per pi-Soft unit: the masks drawn against the distinct masks the evaluator runs (no model, no timing).

    PYTHONPATH=src python benchmarks/count_forwards.py [--vectors 20] [--samples 15]

One step of pi-Soft-NC/NS draws ``1 + 2 K S`` masks (the zero baseline, then NS and NC for K = 19 pi values plus
alpha = 1, S samples, coupled). :meth:`llmattr.faithfulness.engine.PerturbationEngine.probs` runs each distinct mask
once (repeated masks are read back), so on short inputs far fewer rows reach the model. For random score vectors
mapped like a method's (min-max: one exact 0 and one exact 1) this prints, per content length m, the masks drawn,
the distinct masks (what the model runs) and their share, under the retain rule of :func:`soft.transform`.
"""

from __future__ import annotations

import argparse

import torch

from llmattr.faithfulness.soft import PI_GRID, draw_masks, transform
from llmattr.scores import retain_probs


def distinct_rows(s: torch.Tensor, samples: int, seed: int) -> tuple[int, int]:
    """(masks drawn, distinct masks) of one step: the zero baseline and the coupled NS/NC masks of every pi."""
    pis = torch.tensor(PI_GRID, dtype=torch.float64)
    s_tilde = torch.cat([transform(s, pis), s[None]])
    masks = draw_masks(s_tilde, samples, torch.Generator().manual_seed(seed))
    batch = torch.cat([torch.zeros(1, s.numel())] + [mask.flatten(0, 1) for mask in masks.values()])
    return batch.shape[0], torch.unique(batch, dim=0).shape[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vectors", type=int, default=20)
    parser.add_argument("--samples", type=int, default=15)
    args = parser.parse_args()
    print("m  masks drawn  distinct (run)  share")
    for m in (10, 20, 40, 80):
        drawn = distinct = 0
        for seed in range(args.vectors):
            raw = torch.randn(m, generator=torch.Generator().manual_seed(1000 * m + seed), dtype=torch.float64)
            s, _ = retain_probs(raw, signed=False)
            rows, unique = distinct_rows(s, args.samples, seed)
            drawn, distinct = drawn + rows, distinct + unique
        print(f"{m:<3}{drawn / args.vectors:>12.0f}{distinct / args.vectors:>16.1f}{distinct / drawn:>7.1%}")


if __name__ == "__main__":
    main()
