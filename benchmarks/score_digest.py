"""Every registered method's raw scores and convergence deltas on the tests' tiny models, as digests to diff.

    PYTHONPATH=src python benchmarks/score_digest.py [--archs llama,gpt2] [--methods saliency,...] > after.txt
    diff before.txt after.txt

A refactoring that must not change a number (issue 39: "scores and deltas before and after the change are
bit-equal") is checked by running this at both revisions and diffing the outputs: one line per (architecture,
task, method, call) with the SHA-256 of the raw score matrix's float64 bytes, of the steps' target and
convergence deltas, and the largest |score| (for the eye). Each method runs twice on the same loaded model, so a
kept cache (the template prefix, the zero-input prefix, the path prefix) is both filled and read. A method that
refuses a model prints its one line instead.

Scores below ``NOISE`` in absolute value are digested as zero: LIME's least-squares fit of an output that does
not depend on the span (the tiny Gemma 3's sliding window of 4 hides the span from the answer) is rounding noise
of about 1e-18 that differs from run to run of the same code (the solver's SIMD path follows memory alignment).
Every other value is digested to the bit.
"""

from __future__ import annotations

import argparse
import hashlib
import struct
import sys
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import torch  # noqa: E402

import llmattr  # noqa: E402
from conftest import ARCHS, build_tiny, make_tiny_tokenizer  # noqa: E402
from llmattr import methods  # noqa: E402
from llmattr.errors import LlmattrError  # noqa: E402

TEXT = "An engrossing film that is never boring, with a terrific cast."
CASES = (("sentiment", {}), ("generate", {"max_new_tokens": 2}))
NOISE = 1e-15
FAST = {"n_steps": 4}  # path methods: few points (the digest, not the estimate, is the point)


def digest(values: list[float | None]) -> str:
    data = b"".join(struct.pack("<d", float("nan") if v is None else 0.0 if abs(v) < NOISE else v) for v in values)
    return hashlib.sha256(data).hexdigest()[:16]


def line(expl) -> str:
    raw = expl.score_matrix(raw=True)
    raw = torch.where(raw.abs() < NOISE, 0.0, raw)
    deltas = [v for s in expl.steps for v in (s.target_delta, s.convergence_delta)]
    return f"raw {digest(raw.flatten().tolist())} deltas {digest(deltas)} max|raw| {raw.abs().max().item():.6g}"


def params_for(name: str) -> dict:
    defaults = methods.REGISTRY[name].defaults
    return {k: v for k, v in FAST.items() if k in defaults}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--archs", default=",".join(ARCHS))
    parser.add_argument("--methods", default=None, help="comma-separated (default: every registered method)")
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    torch.set_num_threads(1)
    tokenizer = make_tiny_tokenizer()
    names = args.methods.split(",") if args.methods else sorted(methods.REGISTRY)
    for arch in args.archs.split(","):
        lm = build_tiny(arch, tokenizer)
        for task, kwargs in CASES:
            for name in names:
                for call in (1, 2):
                    torch.manual_seed(0)
                    try:
                        expl = llmattr.explain(TEXT, model=lm, method=name, task=task, progress=False,
                                               **kwargs, **params_for(name))
                        out = line(expl)
                    except LlmattrError as err:
                        out = f"refused: {err}"
                    print(f"{arch} {task} {name} #{call}: {out}", flush=True)


if __name__ == "__main__":
    main()
