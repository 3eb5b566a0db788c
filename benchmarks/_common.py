"""Shared benchmark helpers: data location, timing, and the single-gradient floor."""

from __future__ import annotations

import json
import statistics
import time

import torch

from llmattr.tasks.datasets import data_dir

DATA = data_dir()


def read_jsonl(name: str, n: int, field: str = "text") -> list[str]:
    """The first ``n`` values of ``field`` in ``llmattr/data/<name>.jsonl``."""
    with open(DATA / f"{name}.jsonl") as handle:
        return [json.loads(line)[field] for _, line in zip(range(n), handle, strict=False)]


def timed(fn, repeats: int = 3) -> float:
    """Median wall time of ``fn()`` over ``repeats`` calls (after one warm-up call)."""
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def floor_fn(lm, target):
    """One plain forward + backward to the input embeddings for the first explained token (the floor)."""
    def run():
        embeds = lm.embed(target.input_ids).detach().requires_grad_(True)
        logits = lm.model(inputs_embeds=embeds, logits_to_keep=1, use_cache=False).logits
        (grad,) = torch.autograd.grad(logits[0, -1, target.target_ids[-1]], embeds)
        return grad
    return run


def once(fn) -> float:
    """Wall time of one call of ``fn``."""
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def per_example(runs: dict, repeats: int, failed: dict, reference: str = "floor") -> dict[str, float]:
    """Seconds of every run on one example: the median of ``repeats`` interleaved rounds for the runs
    under 4x the ``reference`` run (their ratios are the targets and are sensitive to what ran just
    before), one round for the others. A run that raises is reported once and left out."""
    rounds: dict[str, list[float]] = {}
    for r in range(repeats):
        for name, fn in runs.items():
            if name in failed or (r and rounds[name][0] > 4 * rounds[reference][0]):
                continue
            try:
                seconds = once(fn)
            except Exception as error:  # noqa: BLE001 - one failing method must not lose the whole table
                failed[name] = f"{type(error).__name__}: {error}"
                continue
            rounds.setdefault(name, []).append(seconds)
    return {name: statistics.median(v) for name, v in rounds.items()}


def table(rows: list[tuple], header: tuple) -> str:
    """A Markdown table."""
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    line = lambda r: "| " + " | ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True)) + " |"  # noqa: E731
    return "\n".join([line(header), "|" + "|".join("-" * (w + 2) for w in widths) + "|", *map(line, rows)])


def generation_arguments(parser) -> None:
    """The options every timing benchmark shares: generations, their length, interleaved rounds."""
    parser.add_argument("--n-gen", type=int, default=3, help="generations timed (SST-2 sentences)")
    parser.add_argument("--gen-tokens", type=int, default=5, help="tokens generated and explained")
    parser.add_argument("--repeats", type=int, default=3, help="interleaved rounds for the cheap runs")

