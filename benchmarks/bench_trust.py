"""The cost of each trust check (docs/trust.md) against the plain evaluation, in the same run.

On the embedded model (or ``--model``), for ``--examples`` SST-2 examples and each of ``--methods``: the plain
evaluation (the attribution, then pi-soft, soft, comp-suff, log-odds and deletion-insertion under dynamic routing)
and each check on the same explanation:

* ``model-randomization``: 1 + 2 x (checked blocks) re-attributions (``--sanity-stride``: every k-th block);
* ``data-randomization``: 2 re-attributions (here against the model itself: the cost without the second model's load);
* ``reliability``: the measured metrics (``--reliability-of``) on the explanation and 4 perturbed copies.

Printed: seconds per example of each, and its ratio to the plain evaluation. The load average is printed beside
the numbers (2 shared cores: run it alone). Usage: ``python benchmarks/bench_trust.py [--examples 2] [--methods
saliency,grad-ellm,random] [--samples 15] [--sanity-stride 1] [--reliability-of pi-soft,soft,comp-suff,log-odds,
deletion-insertion] [--model default]``.
"""

from __future__ import annotations

import argparse
import os
import statistics

from _common import once, read_jsonl
from llmattr.api import explain
from llmattr.faithfulness import METRICS, MetricContext, MetricOptions
from llmattr.faithfulness.sanity import data_randomization
from llmattr.models.loading import load_model

PLAIN = ("pi-soft", "soft", "comp-suff", "log-odds", "deletion-insertion")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--examples", type=int, default=2)
    parser.add_argument("--methods", default="saliency,grad-ellm,random")
    parser.add_argument("--samples", type=int, default=15)
    parser.add_argument("--sanity-stride", type=int, default=1)
    parser.add_argument("--reliability-of", default=",".join(PLAIN))
    parser.add_argument("--model", default="default")
    args = parser.parse_args()
    lm = load_model(args.model, device="cpu")
    options = MetricOptions(values={"samples": args.samples, "sanity_stride": args.sanity_stride,
                                    "reliability_of": args.reliability_of})
    times: dict[str, list[float]] = {}
    for text in read_jsonl("sst2", args.examples):
        for method in args.methods.split(","):
            holder = {}

            def attribute(method=method, holder=holder, text=text):
                holder["expl"] = explain(text, model=lm, method=method, task="sentiment")

            seconds = once(attribute)
            expl = holder["expl"]

            def metrics(names, expl=expl):
                ctx = MetricContext(lm, expl, options)
                for name in names:
                    metric = METRICS[name]
                    metric.compute(ctx, "dynamic" if metric.routed else "none")

            runs = {"plain evaluation": lambda: metrics(PLAIN),
                    "model-randomization": lambda: metrics(["model-randomization"]),
                    "data-randomization": lambda expl=expl: data_randomization(lm, lm, expl),
                    "reliability": lambda: metrics(["reliability"])}
            for name, fn in runs.items():
                times.setdefault(name, []).append(once(fn) + (seconds if name == "plain evaluation" else 0.0))
    plain = statistics.mean(times["plain evaluation"])
    print(f"{lm.model_id}, {args.examples} example(s) x {args.methods}; load average {os.getloadavg()[0]:.2f}")
    print(f"{'check':<22}{'s / explanation':>16}{'x plain':>10}")
    for name, values in times.items():
        mean = statistics.mean(values)
        print(f"{name:<22}{mean:>16.2f}{mean / plain:>10.2f}")


if __name__ == "__main__":
    main()
