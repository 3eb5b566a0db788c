"""float32 vs bfloat16 on one device: the evaluator's speed and what bf16 changes in the metrics (issue 15).

The embedded model is loaded twice, in float32 and in bfloat16 (``load_model(dtype=...)``). For each of ``--n``
SST-2 examples, interleaved so that the machine's load falls on both alike, each dtype runs the unit of
``llmattr evaluate``: the target (the gold label word, so that both dtypes explain the same token), every method's
attribution, then pi-Soft-NC/NS under dynamic routing (19 pi x ``--samples`` x NC+NS + the zero baseline, the
same coupled masks in both dtypes). Whatever the weights' dtype, probabilities, distances and the alpha search run in
float32/float64 (docs/scale.md), so the differences printed are those of the model's bf16 forward passes.

Printed:

* seconds of the evaluator (and of the attributions) in each dtype, and fp32 / bf16 (target >= 2x on a CPU with
  bf16 matrix units);
* per AUC (pi-Soft-NC, pi-Soft-NS): the mean and the largest |AUC_bf16 - AUC_fp32| over (example, method)
  (target: mean <= 0.01);
* each dtype's methods ranked by mean AUC (target: the same order);
* per method, the mean over examples of the Spearman correlation between its fp32 and bf16 token scores
  (scipy.stats.spearmanr; random draws the same scores in both, so its 1.0 checks the seeding).

Usage: ``python benchmarks/bench_dtype.py [--n 20] [--samples 15] [--methods grad-ellm,saliency,attention,random]``
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections import defaultdict

import torch
from scipy.stats import spearmanr

from llmattr import methods as registry
from llmattr.api import attribute, prepare
from llmattr.evaluation import load_dataset
from llmattr.faithfulness import evaluate
from llmattr.models.loading import load_model, native_bf16
from llmattr.request import Request
from llmattr.stats import stable_seed

DTYPES = ("fp32", "bf16")
AUCS = ("auc_nc", "auc_ns")


def timed(fn):
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


def unit(lm, data, example: dict, method: str, samples: int, seed: int) -> tuple[list[float], dict, float, float]:
    """Scores, AUCs, attribution seconds and evaluator seconds of one (example, method) in ``lm``'s dtype."""
    fields = {f: example[f] for f in data.task.fields}
    target = prepare(lm, fields, Request(data.task, target="gold", gold=example.get("label")))
    torch.manual_seed(stable_seed(seed, data.name, str(example["id"]), method, bits=31))
    expl, attribution_s = timed(lambda: attribute(lm, target, registry.get(method), Request(data.task)))
    result, evaluator_s = timed(lambda: evaluate(expl, lm, samples=samples, seed=seed))
    return expl.steps[0].scores, {key: getattr(result, key) for key in AUCS}, attribution_s, evaluator_s


def run(args) -> dict:
    models = {dtype: load_model("default", device=args.device, dtype=dtype) for dtype in DTYPES}
    data = load_dataset("sst2", args.n, args.seed)
    scores: dict = defaultdict(dict)   # (dtype, method) -> example -> scores
    aucs: dict = defaultdict(dict)     # (dtype, method) -> example -> {auc_nc, auc_ns}
    seconds = {dtype: {"attribution": 0.0, "evaluator": 0.0} for dtype in DTYPES}
    for example in data.examples:
        for method in args.methods:
            for dtype, lm in models.items():
                s, a, attribution_s, evaluator_s = unit(lm, data, example, method, args.samples, args.seed)
                scores[(dtype, method)][example["id"]] = s
                aucs[(dtype, method)][example["id"]] = a
                seconds[dtype]["attribution"] += attribution_s
                seconds[dtype]["evaluator"] += evaluator_s
    return {"scores": scores, "aucs": aucs, "seconds": seconds, "examples": [e["id"] for e in data.examples]}


def report(args, r: dict) -> str:
    sec, aucs, ids = r["seconds"], r["aucs"], r["examples"]
    lines = [f"{args.device}, {torch.get_num_threads()} threads, native bf16 matrix units: {native_bf16(args.device)}; "
             f"{len(ids)} SST-2 examples x {len(args.methods)} methods, samples {args.samples}", ""]
    for part in ("evaluator", "attribution"):
        lines.append(f"{part}: fp32 {sec['fp32'][part]:.1f} s, bf16 {sec['bf16'][part]:.1f} s, "
                     f"fp32 / bf16 = {sec['fp32'][part] / sec['bf16'][part]:.2f}x")
    lines.append("")
    for key in AUCS:
        diffs = [abs(aucs[("bf16", m)][i][key] - aucs[("fp32", m)][i][key]) for m in args.methods for i in ids]
        lines.append(f"{key}: mean |bf16 - fp32| {statistics.fmean(diffs):.4f}, max {max(diffs):.4f} "
                     f"over {len(diffs)} (example, method)")
        for dtype in DTYPES:
            means = {m: statistics.fmean(aucs[(dtype, m)][i][key] for i in ids) for m in args.methods}
            order = sorted(means, key=means.get, reverse=True)
            lines.append(f"  {dtype} ranking: " + " > ".join(f"{m} {means[m]:.4f}" for m in order))
    lines.append("")
    for m in args.methods:
        rhos = [spearmanr(r["scores"][("fp32", m)][i], r["scores"][("bf16", m)][i]).statistic for i in ids]
        lines.append(f"{m}: mean Spearman rho of scores fp32 vs bf16 {statistics.fmean(rhos):.4f} "
                     f"(min {min(rhos):.4f})")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=20, help="SST-2 examples")
    parser.add_argument("--methods", type=lambda s: s.split(","),
                        default=["grad-ellm", "saliency", "attention", "random"])
    parser.add_argument("--samples", type=int, default=15, help="Monte-Carlo samples per pi (paper: 15)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args(argv)
    text = report(args, run(args))
    print(text, flush=True)
    return text


if __name__ == "__main__":
    main()
