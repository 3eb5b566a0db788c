"""F-Fidelity on a plain and a robust (``llmattr finetune --mask-augment``) model, side by side (docs/trust.md).

    python benchmarks/ffid_compare.py PLAIN.sqlite ROBUST.sqlite [--metrics ffid_plus,ffid_minus,deletion_auc]

Each store holds one ``llmattr evaluate --metrics f-fidelity,deletion-insertion`` run (one model, one dataset).
Printed per stored value (FFid+, FFid- averaged over the ratios; deletion AUC): each method's mean with the 95%
bootstrap interval and the paired sign-flip p-value against the random control on each model, over the examples
both hold (``llmattr.stats``, as the report), then the ranking of the methods (controls left out) on each model and
Kendall's tau-b between the two rankings: whether the robust model reorders the methods.
"""

from __future__ import annotations

import argparse

from scipy import stats as sps

from _common import table
from llmattr.report.queries import example_values
from llmattr.stats import estimate, paired_test
from llmattr.store import Results

HIGHER = {"ffid_plus": True, "ffid_minus": False, "deletion_auc": True}
CONTROL = "random"


def cells(path: str, metric: str) -> dict[str, dict[str, float]]:
    """``{method: {example: value}}`` of the store's one model and dataset (each method with one parameter set)."""
    results = Results([path])
    (model,) = results.models()
    return {label.split(":")[0]: values
            for (_dataset, label), values in example_values(results, model, metric, "none").items()}


def summary(values: dict[str, dict[str, float]]) -> dict[str, str]:
    """Each method's ``mean ± half-width (p vs random)`` over the examples it shares with the control."""
    out = {}
    for label, per in values.items():
        shared = {ex: v for ex, v in per.items() if ex in values.get(CONTROL, {})}
        est = estimate({"d": shared or per})
        cell = f"{est.mean:.3f} ± {est.half_width:.3f}" if est.half_width is not None else f"{est.mean:.3f}"
        if label != CONTROL and shared:
            p = paired_test({"d": shared}, {"d": {ex: values[CONTROL][ex] for ex in shared}})
            cell += f" (p = {p:.3g})" if p is not None else ""
        out[label] = f"{cell}, n = {est.n}"
    return out


def ranking(values: dict[str, dict[str, float]], higher: bool) -> list[str]:
    """The methods (controls left out) from best to worst by their mean."""
    means = {label: sum(v.values()) / len(v) for label, v in values.items() if label != CONTROL and v}
    return sorted(means, key=lambda label: -means[label] if higher else means[label])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("plain")
    parser.add_argument("robust")
    parser.add_argument("--metrics", default="ffid_plus,ffid_minus,deletion_auc")
    args = parser.parse_args()
    for metric in args.metrics.split(","):
        plain, robust = cells(args.plain, metric), cells(args.robust, metric)
        a, b = summary(plain), summary(robust)
        print(f"\n### {metric} ({'higher' if HIGHER.get(metric, True) else 'lower'} is better)\n")
        print(table([(m, a.get(m, "–"), b.get(m, "–")) for m in sorted(set(a) | set(b))],
                    ("method", "plain model", "robust model")))
        first, second = ranking(plain, HIGHER.get(metric, True)), ranking(robust, HIGHER.get(metric, True))
        common = [m for m in first if m in second]
        tau = sps.kendalltau([first.index(m) for m in common], [second.index(m) for m in common]).statistic
        print(f"\nranking, plain: {' > '.join(first)}\nranking, robust: {' > '.join(second)}\n"
              f"Kendall tau-b between them: {tau:.3f} ({len(common)} methods)")


if __name__ == "__main__":
    main()
