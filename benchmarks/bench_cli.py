"""How fast the CLI answers what needs no model (issue 35 item 7): the wall time of ``llmattr --help``, of every
sub-command's ``--help`` and of a few model-free refusals, each a fresh process, beside ``python -c pass`` (the
interpreter's floor) and ``python -c "import torch"`` (what the fast path must not pay). Median of ``--repeats``
runs after one warm-up. The acceptance: every row under 1 s. Run alone (the numbers are wall times):
python benchmarks/bench_cli.py [--repeats 5]; two revisions: python benchmarks/compare.py A B benchmarks/bench_cli.py
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from _common import table

ROOT = Path(__file__).resolve().parents[1]
SRC = os.environ.get("PYTHONPATH") or str(ROOT / "src")  # another revision's src (benchmarks/compare.py), else ours
FILES = ROOT / "tests" / "data" / "cli_refusals"  # a user's bad files (tests/test_cli_fast.py refuses each)
CLI = "import sys; from llmattr.cli import main; sys.argv[0] = 'llmattr'; main()"
ROWS = {
    "python -c pass": ["-c", "pass"],
    "python -c 'import torch'": ["-c", "import torch"],
    "llmattr --help": ["-c", CLI, "--help"],
    **{f"llmattr {c} --help": ["-c", CLI, c, "--help"]
       for c in ("explain", "evaluate", "evaluate-scores", "finetune", "methods", "report", "status")},
    "refuse: explain --method nope": ["-c", CLI, "explain", "--method", "nope", "hi"],
    "refuse: explain ''": ["-c", CLI, "explain", ""],
    "refuse: explain --objective nope": ["-c", CLI, "explain", "--objective", "nope", "hi"],
    "refuse: explain --html in no folder": ["-c", CLI, "explain", "--html", "/nonexistent/x.html", "hi"],
    "refuse: explain --param foo=1": ["-c", CLI, "explain", "--method", "saliency", "--param", "foo=1", "hi"],
    "refuse: explain --dtype float8": ["-c", CLI, "explain", "--dtype", "float8", "hi"],
    "refuse: explain overlapping --span": ["-c", CLI, "explain", "--span", "0:3", "--span", "2:4", "hello"],
    "refuse: explain --data latin-1 CSV": ["-c", CLI, "explain", "--data", str(FILES / "latin1.csv")],
    "refuse: explain --data no text column": ["-c", CLI, "explain", "--data", str(FILES / "reviews.csv")],
    "refuse: evaluate --n 0": ["-c", CLI, "evaluate", "--n", "0"],
    "refuse: evaluate --datasets nope": ["-c", CLI, "evaluate", "--datasets", "nope"],
    "refuse: evaluate --metrics nope": ["-c", CLI, "evaluate", "--metrics", "nope"],
    "refuse: evaluate --config dtype=float8": ["-c", CLI, "evaluate", "--config", str(FILES / "config-dtype.toml")],
    "refuse: evaluate --data broken JSONL": ["-c", CLI, "evaluate", "--data", str(FILES / "broken.jsonl")],
    "refuse: evaluate-scores missing file": ["-c", CLI, "evaluate-scores", "/nonexistent/s.json"],
    "refuse: report missing store": ["-c", CLI, "report", "/nonexistent/x.sqlite"],
    "refuse: finetune --task nope": ["-c", CLI, "finetune", "--out", "/nonexistent/f", "--task", "nope"],
    "refuse: finetune --task generate": ["-c", CLI, "finetune", "--out", "/nonexistent/f", "--task", "generate"],
    "refuse: finetune --head nope": ["-c", CLI, "finetune", "--out", "/nonexistent/f", "--head", "nope"],
    "refuse: finetune --data empty file": ["-c", CLI, "finetune", "--out", "/nonexistent/f", "--data",
                                           str(FILES / "empty.csv")],
    "refuse: explain --n-steps 0": ["-c", CLI, "explain", "--method", "integrated-gradients", "--n-steps", "0", "hi"],
    "refuse: evaluate --layers x": ["-c", CLI, "evaluate", "--layers", "x"],
    "refuse: evaluate --ffid-beta 2": ["-c", CLI, "evaluate", "--ffid-beta", "2"],
    "refuse: explain leave-one-out, no sources": ["-c", CLI, "explain", "--method", "leave-one-out", "hi"],
    "refuse: explain --shots, no sample data": ["-c", CLI, "explain", "--task", "generate", "--shots", "2", "hi"],
    "refuse: explain reagent sampler=mlm alone": ["-c", CLI, "explain", "--method", "reagent", "--sampler", "mlm",
                                                  "hi"],
    "refuse: evaluate --reliability-of nope": ["-c", CLI, "evaluate", "--reliability-of", "nope"],
    "refuse: evaluate --data, a label no word": ["-c", CLI, "evaluate", "--data", str(FILES / "labels.csv"),
                                                 "--text-field", "review", "--label-field", "sentiment"],
    "refuse: finetune --held-out 5000": ["-c", CLI, "finetune", "--out", "/nonexistent/f", "--held-out", "5000"],
    "refuse: finetune --out a finished run": ["-c", CLI, "finetune", "--out", str(FILES / "finished")],
}


def wall(args: list[str], repeats: int) -> float:
    """Median wall time of ``python ARGS`` in a fresh process over ``repeats`` runs, after one warm-up."""
    env = {**os.environ, "PYTHONPATH": SRC, "COLUMNS": "100"}
    times = []
    for i in range(repeats + 1):
        start = time.perf_counter()
        subprocess.run([sys.executable, *args], env=env, capture_output=True)
        if i:
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    repeats = parser.parse_args().repeats
    print(f"median wall time of {repeats} runs (load average {os.getloadavg()[0]:.2f}); acceptance: < 1 s\n")
    print(table([(name, f"{wall(args, repeats):.3f}") for name, args in ROWS.items()], ("command", "seconds")))


if __name__ == "__main__":
    main()
