"""What ``llmattr.explain`` adds around the attribution: the free answer, the label-word probabilities, the step
probabilities and the packaging, per call, against the attribution alone and the floor.

Embedded model on the CPU, ``--n`` SST-2 sentences, sentiment task (the predicted label word explained). Per
sentence, interleaved: the public ``llmattr.explain(text, model=lm, method=m)``, the same method's ``attribute`` on
the prepared target, and the floor (one forward + backward to the input embeddings). ``overhead`` = explain -
attribute: the generation that gives the free answer and the label-word probabilities is the prompt's one forward
the target needs anyway, so what it adds should be a fraction of the floor.
Run: python benchmarks/bench_overhead.py [--n 6 --methods saliency,integrated-gradients]
"""

from __future__ import annotations

import argparse
import statistics
import sys

import torch

import llmattr
from _common import floor_fn, per_example, read_jsonl, table
from llmattr import load_model, methods
from llmattr.api import prepare
from llmattr.request import Request
from llmattr.tasks import get_task


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=6)
    parser.add_argument("--methods", default="saliency,integrated-gradients")
    parser.add_argument("--repeats", type=int, default=3, help="interleaved rounds per sentence")
    args = parser.parse_args()
    torch.manual_seed(0)
    lm = load_model("default", device="cpu")
    task = get_task("sentiment")
    names = args.methods.split(",")
    texts = read_jsonl("sst2", args.n)
    llmattr.explain("A fine film.", model=lm, method=names[0], progress=False)  # warm-up
    times: dict[str, list[float]] = {}
    failed: dict[str, str] = {}
    for i, text in enumerate(texts):
        target = prepare(lm, text, Request(task))
        runs = {"floor": floor_fn(lm, target), "prepare": lambda t=text: prepare(lm, t, Request(task))}
        for name in names:
            method = methods.get(name)
            runs[f"explain {name}"] = lambda t=text, m=method: llmattr.explain(t, model=lm, method=m, progress=False)
            runs[f"attribute {name}"] = lambda m=method, t=target: m.attribute(lm, t)
        for key, seconds in per_example(runs, args.repeats, failed).items():
            times.setdefault(key, []).append(seconds)
        print(f"sentence {i + 1}/{len(texts)}", file=sys.stderr, flush=True)
    for key, error in failed.items():
        print(f"FAILED {key}: {error}", file=sys.stderr)
    med = {key: statistics.median(v) for key, v in times.items()}
    print(f"{len(texts)} SST-2 sentences, torch threads {torch.get_num_threads()}; median seconds per call\n")
    rows = [("floor", f"{med['floor']:.3f}", "", "", ""), ("prepare", f"{med['prepare']:.3f}", "", "", "")]
    for name in names:
        overhead = statistics.median(e - a for e, a in zip(times[f"explain {name}"], times[f"attribute {name}"],
                                                            strict=True))
        rows.append((name, f"{med[f'explain {name}']:.3f}", f"{med[f'attribute {name}']:.3f}", f"{overhead:.3f}",
                     f"{overhead / med['floor']:.2f}"))
    print(table(rows, ("run", "explain s", "attribute s", "overhead s", "overhead x floor")))


if __name__ == "__main__":
    main()
