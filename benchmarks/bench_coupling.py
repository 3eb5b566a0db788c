"""Coupled vs independent Monte-Carlo masks: the variance of an AUC difference between two methods.

On the embedded model and the first SST-2 examples, two methods (default grad-ellm and attention) are
explained once; then, for each of ``--seeds`` seeds and each coupling, the mean over the examples of
AUC(A) - AUC(B) is computed for pi-Soft-NS and pi-Soft-NC. The Monte-Carlo noise of that difference is
its standard deviation over the seeds (the explanations and examples are fixed, only the masks change).
Coupled masks (common random numbers, the default) should give a smaller one; the printed ratio is
``var(coupled) / var(independent)``. Each method's expected AUC is the same under both couplings, so the
mean differences agree up to that noise.

Usage: ``python benchmarks/bench_coupling.py [--examples 4] [--seeds 20] [--samples 3] [--pis 0.25,0.5,0.75]``.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from scipy.stats import f as f_distribution

import llmattr
from _common import read_jsonl
from llmattr.faithfulness.soft import COUPLINGS
from llmattr.models.loading import load_model

FAMILIES = (("auc_ns", "pi-Soft-NS"), ("auc_nc", "pi-Soft-NC"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=4, help="SST-2 examples")
    parser.add_argument("--seeds", type=int, default=20, help="Monte-Carlo seeds per coupling (>= 20)")
    parser.add_argument("--samples", type=int, default=3, help="Monte-Carlo samples per pi")
    parser.add_argument("--pis", default="0.25,0.5,0.75", help="pi grid")
    parser.add_argument("--methods", default="grad-ellm,attention", help="the two methods compared")
    args = parser.parse_args()
    pis = [float(p) for p in args.pis.split(",")]
    a, b = args.methods.split(",")
    torch.manual_seed(0)
    lm = load_model("default", device="cpu")
    texts = read_jsonl("sst2", args.examples)
    expls = {m: [llmattr.explain(t, model=lm, method=m) for t in texts] for m in (a, b)}
    start = time.perf_counter()
    diffs: dict = {(c, f): [] for c in COUPLINGS for f, _ in FAMILIES}
    for coupling in COUPLINGS:
        for seed in range(args.seeds):
            results = {m: [llmattr.evaluate(e, lm, samples=args.samples, seed=seed, pis=pis, coupling=coupling)
                           for e in expls[m]] for m in (a, b)}
            for family, _ in FAMILIES:
                per_example = [getattr(ra, family) - getattr(rb, family)
                               for ra, rb in zip(results[a], results[b], strict=True)]
                diffs[(coupling, family)].append(statistics.fmean(per_example))
    seconds = time.perf_counter() - start
    print(f"{args.examples} SST-2 examples, {a} vs {b}, {args.seeds} seeds x {len(COUPLINGS)} couplings, "
          f"{args.samples} samples x {len(pis)} pi, {seconds:.0f} s ({torch.get_num_threads()} threads)")
    for family, name in FAMILIES:
        sd = {c: statistics.stdev(diffs[(c, family)]) for c in COUPLINGS}
        means = ", ".join(f"{c} {statistics.fmean(diffs[(c, family)]):+.4f}" for c in COUPLINGS)
        ratio = (sd["coupled"] / sd["independent"]) ** 2
        df = args.seeds - 1  # F interval of a ratio of two independent sample variances
        low, high = ratio / f_distribution.ppf(0.975, df, df), ratio / f_distribution.ppf(0.025, df, df)
        print(f"  AUC {name}({a}) - AUC {name}({b}): mean {means}; SD over seeds coupled {sd['coupled']:.4f}, "
              f"independent {sd['independent']:.4f}; variance ratio coupled / independent "
              f"{ratio:.3f} (95% F interval {low:.2f}-{high:.2f})")


if __name__ == "__main__":
    main()
