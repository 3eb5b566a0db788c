"""The bio-lookup task's dependence on its gold source: the embedded model's accuracy with the gold biography
first, in the middle, last, and absent (another distractor in its place), on every usable WikiBio sample row.

An answer is correct when it names the person (:func:`llmattr.tasks.documents.names_person`: the name's last word
in the greedy answer of ``bio-lookup``'s 8 tokens). Prints one row per condition with the load average.
Run: python benchmarks/bench_gold_sources.py [--n 73 --k 4]
"""

from __future__ import annotations

import argparse
import os
import time

from _common import table
from llmattr import load_model
from llmattr.api import prepare
from llmattr.request import Request
from llmattr.tasks.datasets import data_dir, read_rows
from llmattr.tasks.documents import POSITIONS, names_person, with_documents


def accuracy(lm, examples: list[dict]) -> float:
    """Share of ``examples`` whose greedy bio-lookup answer names the person."""
    request = Request("bio-lookup")
    hits = 0
    for example in examples:
        target = prepare(lm, example, request)
        hits += names_person(lm.tokenizer.decode(target.target_ids.tolist()), example["answer"])
    return hits / len(examples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=None, help="rows (default: every usable one)")
    parser.add_argument("--k", type=int, default=4, help="distractor documents")
    parser.add_argument("--model", default="default")
    args = parser.parse_args()
    lm = load_model(args.model, device="cpu")
    rows = read_rows(data_dir() / "wikibio.jsonl")
    conditions = [(position, True) for position in POSITIONS] + [("middle", False)]
    out = []
    for position, gold in conditions:
        examples = with_documents(rows, args.k, position, gold)[: args.n]
        start = time.perf_counter()
        acc = accuracy(lm, examples)
        out.append([position if gold else "absent", len(examples), f"{acc:.3f}",
                    f"{time.perf_counter() - start:.0f}", f"{os.getloadavg()[0]:.1f}"])
    print(table(out, ("gold document", "n", "accuracy", "seconds", "load")))


if __name__ == "__main__":
    main()
