"""Task accuracy of the embedded model (label-word argmax) with and without few-shot demonstrations.

    python benchmarks/task_accuracy.py [--n 50] [--shots 4]

Evaluated examples and demonstrations come from the package's sample files (llmattr/data; balanced, seed 0)
and never overlap.
"""

from __future__ import annotations

import argparse
import time

from llmattr.evaluation.accuracy import label_accuracy
from llmattr.models.loading import load_model
from llmattr.tasks import get_task, load_split


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=50)
    parser.add_argument("--shots", type=int, default=4)
    parser.add_argument("--tasks", default="sst2,boolq")
    args = parser.parse_args()

    lm = load_model("default", device="cpu")
    for name in args.tasks.split(","):
        task = get_task(name)
        examples, demos = load_split(task, args.n, shots=args.shots, seed=0)
        for shots, text in ((0, ""), (args.shots, demos)):
            start = time.perf_counter()
            result = label_accuracy(lm, task, examples, text, batch_size=4)
            print(f"{name:6s} shots={shots}  accuracy={result['accuracy']:.2f}  predicted={result['predicted']}  "
                  f"({time.perf_counter() - start:.0f} s)", flush=True)


if __name__ == "__main__":
    main()
