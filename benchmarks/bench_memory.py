"""Peak memory of every method against two floors, by prompt length (each run in its own subprocess).

On the embedded model, an IMDb prompt whose review is IMDb texts concatenated to the length asked (sentiment
task, forced answer), each method runs in a fresh Python process; its peak resident memory (``VmHWM``
from the input's construction on: the resident model included, its loading's transient peak not) and, on a
GPU, its peak allocated GPU memory are recorded.
The floors are measured the same way: ``floor-forward`` (one no-grad forward, sdpa attention) and
``floor-backward`` (one forward + backward to the input embeddings, sdpa attention). Printed per method: the
peak at each length, the ratio to its floor at the longest length (forward-only methods against the
forward floor, gradient methods against the forward+backward floor) and the log-log growth exponent of
(peak - the resident model after one 8-token warm-up forward) between the shortest and the longest length of at
least 1k tokens. The pi-Soft evaluator (dynamic and fixed routing, ``--evaluator-sequences`` perturbed
sequences: its peak is set by one chunk) is measured at ``--evaluator-lengths``.

Usage: ``python benchmarks/bench_memory.py [--lengths 512,1024,2048,4096,8192] [--methods attention,saliency]
[--steps 16] [--evaluator-lengths 1024,4096] [--device cpu]``. Path methods at 8k tokens take minutes per
gradient on a CPU; ``--steps`` lowers their number of path points (the peak is set by the internal batch,
which is chosen from the memory budget, so fewer points do not change it).
"""

from __future__ import annotations

import argparse
import json
import math
import resource
import subprocess
import sys
import time

import torch

from _common import read_jsonl, table

FORWARD_ONLY = ("attention", "normxlogit", "logat", "l2-norm", "value-zeroing")
PATH = ("integrated-gradients", "igcg", "aieg", "gradient-shap")
FLOORS = ("floor-forward", "floor-backward")
EVALUATOR = ("evaluator-dynamic", "evaluator-fixed")


def long_text(lm, n_tokens: int) -> str:
    """IMDb reviews concatenated and cut so that the sentiment prompt has ``n_tokens`` tokens in all."""
    from llmattr.api import prepare
    from llmattr.tasks import get_task

    n_tokens -= prepare(lm, "x", get_task("sentiment"), answer="Positive").input_ids.shape[1]  # the template
    texts, ids = read_jsonl("imdb", 400), []
    for text in texts:
        ids += lm.tokenizer(" " + text, add_special_tokens=False)["input_ids"]
        if len(ids) >= n_tokens:
            break
    return lm.tokenizer.decode(ids[:n_tokens]).strip()


def method_params(name: str, steps: int) -> dict:
    if name in ("integrated-gradients", "igcg", "aieg"):
        return {"n_steps": steps}
    if name == "gradient-shap":
        return {"n_samples": steps}
    if name == "lime":
        return {"n_samples": steps}
    if name == "reagent":
        return {"max_probe_steps": max(1, steps // 4), "num_probes": 2}
    return {}


def rss_mb(field: str = "VmHWM") -> float:
    """Peak (``VmHWM``) or current (``VmRSS``) resident memory of this process (MB), from /proc."""
    with open("/proc/self/status") as handle:
        line = next(line for line in handle if line.startswith(field + ":"))
    return int(line.split()[1]) / 1024


def reset_peak() -> None:
    """Start the peak over from the current resident size (Linux ``clear_refs`` 5), so model loading's own
    transient peak does not hide the run's."""
    with open("/proc/self/clear_refs", "w") as handle:
        handle.write("5")


def worker(name: str, length: int, steps: int, device: str, sequences: int) -> dict:
    """Run one measurement in this process and return its peaks."""
    from llmattr import methods
    from llmattr.api import prepare
    from llmattr.faithfulness.engine import PerturbationEngine
    from llmattr.models.loading import load_model
    from llmattr.tasks import get_task

    lm = load_model("default", device=device)
    target = prepare(lm, long_text(lm, length), get_task("sentiment"), answer="Positive")
    with torch.no_grad():  # page the memory-mapped weights in: the base is the resident model
        lm.model(target.input_ids[:, :8].to(lm.device))
    base = rss_mb("VmRSS")
    reset_peak()
    if device != "cpu":
        torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    if name == "floor-forward":
        with torch.no_grad():
            lm.model(inputs_embeds=lm.embed(target.input_ids), logits_to_keep=1, use_cache=False)
    elif name == "floor-backward":
        embeds = lm.embed(target.input_ids).detach().requires_grad_(True)
        logits = lm.model(inputs_embeds=embeds, logits_to_keep=1, use_cache=False).logits
        torch.autograd.grad(logits[0, -1, target.target_ids[-1]], embeds)
    elif name in EVALUATOR:
        engine = PerturbationEngine(lm, target, routing=name.split("-")[1])
        m = target.span[1] - target.span[0]
        engine.probs(torch.bernoulli(torch.full((sequences, m), 0.5), generator=torch.Generator().manual_seed(0)))
    else:
        methods.get(name, **method_params(name, steps)).attribute(lm, target)
    seconds = time.perf_counter() - start
    gpu = torch.cuda.max_memory_allocated() / 2**20 if device != "cpu" else None
    return {"peak_mb": rss_mb(), "base_mb": base, "gpu_mb": gpu, "tokens": int(target.input_ids.shape[1]),
            "seconds": seconds, "process_peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def measure(name: str, length: int, args) -> dict | str:
    """One run in a fresh subprocess: its peaks, or the last line of its error."""
    cmd = [sys.executable, __file__, "--worker", name, "--length", str(length), "--steps", str(args.steps),
           "--device", args.device, "--evaluator-sequences", str(args.evaluator_sequences)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode:
        return (done.stderr.strip().splitlines() or ["failed"])[-1]
    return json.loads(done.stdout.strip().splitlines()[-1])


def exponent(points: dict[int, dict]) -> float | None:
    """Slope of log(peak - base) against log(tokens) between the shortest (>= 1k) and the longest length."""
    usable = sorted(n for n in points if n >= 1024)
    if len(usable) < 2:
        return None
    lo, hi = points[usable[0]], points[usable[-1]]
    grow = [max(p["peak_mb"] - p["base_mb"], 1e-3) for p in (lo, hi)]
    return math.log(grow[1] / grow[0]) / math.log(hi["tokens"] / lo["tokens"])


def main() -> None:
    from llmattr import methods

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", default="512,1024,2048,4096,8192")
    parser.add_argument("--methods", default="all", help="comma-separated names, or all")
    parser.add_argument("--steps", type=int, default=16, help="path points / samples of the sampled methods")
    parser.add_argument("--evaluator-lengths", default="1024,4096", help="empty: skip the evaluator")
    parser.add_argument("--evaluator-sequences", type=int, default=64)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--length", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker, args.length, args.steps, args.device, args.evaluator_sequences)))
        return
    lengths = [int(n) for n in args.lengths.split(",")]
    names = methods.available() if args.methods == "all" else args.methods.split(",")
    results: dict[str, dict[int, dict | str]] = {}
    runs = [(name, n) for name in (*FLOORS, *names) for n in lengths]
    runs += [(name, int(n)) for name in EVALUATOR for n in args.evaluator_lengths.split(",") if n]
    for name, n in runs:
        results.setdefault(name, {})[n] = result = measure(name, n, args)
        shown = result if isinstance(result, str) else f"{result['peak_mb']:.0f} MB in {result['seconds']:.1f} s"
        print(f"{name} @ {n}: {shown}", flush=True)
    longest = max(lengths)
    rows = []
    for name, points in results.items():
        ok = {n: p for n, p in points.items() if isinstance(p, dict)}
        floor_name = "floor-forward" if name in (*FORWARD_ONLY, "floor-forward", *EVALUATOR) or \
            name in ("lime", "reagent", "random") else "floor-backward"
        floor = results.get(floor_name, {}).get(max(ok) if ok else longest)
        ratio = "-"
        if ok and isinstance(floor, dict):
            ratio = f"{ok[max(ok)]['peak_mb'] / floor['peak_mb']:.2f} ({floor_name[6:]})"
        slope = exponent(ok)
        cells = [f"{ok[n]['peak_mb']:.0f}" if n in ok else "x" for n in sorted(points)]
        rows.append((name, " / ".join(cells), ",".join(str(n) for n in sorted(points)), ratio,
                     "-" if slope is None else f"{slope:.2f}"))
    print(table(rows, ("method", "peak RSS (MB)", "lengths", "ratio to floor at longest", "growth exponent")))


if __name__ == "__main__":
    main()
