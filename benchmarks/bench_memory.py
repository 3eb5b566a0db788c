"""Peak memory of every method against two floors, by prompt length (each run in its own subprocess).

On the embedded model, an IMDb prompt whose review is IMDb texts concatenated to the length asked (sentiment
task, forced answer), each method runs in a fresh Python process; its peak resident memory (``VmHWM``
from the input's construction on: the resident model included, its loading's transient peak not) and, on a
GPU, its peak allocated GPU memory are recorded.
The floors are measured the same way: ``floor-forward`` (one no-grad forward, sdpa attention) and
``floor-backward`` (one forward + backward to the input embeddings, sdpa attention). Printed per method: the
peak at each length, the ratio to its floor at the longest length (forward-only and perturbation methods against
the forward floor, gradient methods against the forward+backward floor) and the log-log growth exponent of
(peak - the resident model after one 8-token warm-up forward) between the shortest and the longest length of at
least 1k tokens. The pi-Soft evaluator (dynamic and fixed routing) is measured at ``--evaluator-lengths``.

Bounded passes (``--bounded``, the default; ``--full`` runs every method with its defaults). Peak memory is set
by what one pass holds at once (its rows and their length), not by how many passes run, so methods that make
many passes of the full length run fewer of them, each with the rows and the length of the real run:

* IG, IGCG, AIEG: ``n_steps = --path-points`` (2) and GradientSHAP ``n_samples = --path-points``, with
  ``internal_batch_size`` set to what ``"auto"`` picks for the default 16 points (5 samples) at that length
  (:func:`llmattr.models.memory.path_batch`), so every chunk holds as many path points as the real run's;
* LIME: ``n_samples = batch_size`` (16): one pass of the 16 rows every real pass holds (the real run: 50 samples,
  passes of 16, 16, 16, 2 rows);
* ReAGent: ``max_probe_steps = 2``: the first pass holds ``num_probes`` rows, the second ``2 num_probes``
  (updates and checks), as every later pass of the real run does;
* the pi-Soft evaluator: as many perturbed sequences as one of its passes holds
  (:func:`llmattr.models.memory.forward_batch` at that length), i.e. one full pass;
* every other method (attention, logit methods, value zeroing, the decomposition methods (ALTI, GlobEnc,
  ALTI-Logit, attention rollout: their rollout, every layer), saliency, input x gradient, Grad-ELLM,
  DeepLIFT, AttnLRP, CP-LRP, random) runs unbounded, with its defaults.

Resident memory includes what the C allocator keeps after frees: glibc's ``malloc`` raises its mmap threshold as
large blocks are freed, and the heap then holds freed memory, which can add a quarter to a long gradient run's
peak, more or less from run to run (docs/methods-lrp.md, Cost). The workers inherit the environment:
``MALLOC_MMAP_THRESHOLD_=131072 python benchmarks/bench_memory.py ...`` measures with that threshold fixed.

Every method runs as ``llmattr explain`` runs it: the memory guard plans the run (``checkpointing="auto"``:
activation checkpointing only where the plain backward does not fit the available memory, recorded as
``checkpointing`` in the run's parameters). The seconds printed are those of the bounded run, not of the real one.

Usage: ``python benchmarks/bench_memory.py [--lengths 512,1024,2048,4096,8192] [--methods attention,saliency]
[--path-points 2] [--evaluator-lengths 1024,4096] [--device cpu] [--out results.jsonl] [--full]``;
``--table results.jsonl`` prints the table of saved results (runs may be split over several invocations).
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

GRADIENT = ("floor-backward", "saliency", "input-x-gradient", "grad-ellm", "deeplift", "deeplift-ixg",
            "integrated-gradients", "igcg", "aieg", "gradient-shap",
            "attnlrp", "cp-lrp")  # compared with the forward+backward floor
FLOORS = ("floor-forward", "floor-backward")
EVALUATOR = ("evaluator-dynamic", "evaluator-fixed")


def long_text(lm, n_tokens: int) -> str:
    """IMDb reviews concatenated and cut so that the sentiment prompt has ``n_tokens`` tokens in all."""
    from llmattr.api import prepare
    from llmattr.request import Request

    n_tokens -= prepare(lm, "x", Request("sentiment", answer="Positive")).input_ids.shape[1]  # the template
    texts, ids = read_jsonl("imdb", 400), []
    for text in texts:
        ids += lm.tokenizer(" " + text, add_special_tokens=False)["input_ids"]
        if len(ids) >= n_tokens:
            break
    return lm.tokenizer.decode(ids[:n_tokens]).strip()


def method_params(lm, name: str, tokens: int, points: int) -> dict:
    """The bounded run's parameters (module docstring): fewer passes, each as the real run's."""
    from llmattr.models.memory import path_batch

    if name in ("integrated-gradients", "igcg", "aieg"):
        return {"n_steps": points, "internal_batch_size": path_batch(lm, tokens, 16)}
    if name == "gradient-shap":
        return {"n_samples": points, "internal_batch_size": path_batch(lm, tokens, 5)}
    if name == "lime":
        return {"n_samples": 16, "batch_size": 16}
    if name == "reagent":
        return {"max_probe_steps": 2}
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


def worker(name: str, length: int, points: int, device: str, full: bool) -> dict:
    """Run one measurement in this process and return its peaks."""
    from llmattr import methods
    from llmattr.api import prepare
    from llmattr.faithfulness.engine import PerturbationEngine
    from llmattr.models import memory
    from llmattr.models.loading import load_model
    from llmattr.request import Request

    lm = load_model("default", device=device)
    target = prepare(lm, long_text(lm, length), Request("sentiment", answer="Positive"))
    with torch.no_grad():  # page the memory-mapped weights in: the base is the resident model
        lm.model(target.input_ids[:, :8].to(lm.device))
    tokens = int(target.input_ids.shape[1])
    m = target.span[1] - target.span[0]
    params = {} if full or name in (*FLOORS, *EVALUATOR) else method_params(lm, name, tokens, points)
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
        params["sequences"] = 64 if full else engine.batch_size  # bounded: one full pass of perturbed sequences
        keep = torch.full((params["sequences"], m), 0.5)
        engine.probs(torch.bernoulli(keep, generator=torch.Generator().manual_seed(0)))
    else:  # as llmattr.explain runs it: the memory guard's plan, activation checkpointing "auto"
        method = methods.get(name, **params)
        params["checkpointing"] = memory.plan(lm, method, tokens, "auto")
        with method.checkpointing(lm, params["checkpointing"]):
            method.attribute(lm, target)
    seconds = time.perf_counter() - start
    gpu = torch.cuda.max_memory_allocated() / 2**20 if device != "cpu" else None
    return {"name": name, "length": length, "peak_mb": rss_mb(), "base_mb": base, "gpu_mb": gpu, "tokens": tokens,
            "seconds": seconds, "params": params,
            "process_peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def measure(name: str, length: int, args) -> dict | str:
    """One run in a fresh subprocess: its peaks, or the last line of its error."""
    cmd = [sys.executable, __file__, "--worker", name, "--length", str(length), "--path-points",
           str(args.path_points), "--device", args.device] + ["--full"] * args.full
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode:
        return (done.stderr.strip().splitlines() or ["failed"])[-1]
    return json.loads(done.stdout.strip().splitlines()[-1])


NOISE_MB = 32  # what a run adds below this is within the allocator's reuse of freed pages: no slope is read off it


def exponent(points: dict[int, dict]) -> float | str | None:
    """Slope of log(peak - base) against log(tokens) between the shortest (>= 1k) and the longest length, or
    ``"< noise"`` where the run adds less than ``NOISE_MB`` at either length (l2-norm adds 0.4 MB at 1k: the
    allocator reused freed pages, and a slope of such deltas says nothing about growth)."""
    usable = sorted(n for n in points if n >= 1024)
    if len(usable) < 2:
        return None
    lo, hi = points[usable[0]], points[usable[-1]]
    grow = [p["peak_mb"] - p["base_mb"] for p in (lo, hi)]
    if min(grow) < NOISE_MB:
        return f"< noise (+{grow[0]:.0f} / +{grow[1]:.0f} MB)"
    return math.log(grow[1] / grow[0]) / math.log(hi["tokens"] / lo["tokens"])


def print_table(results: dict[str, dict[int, dict | str]]) -> None:
    """Per method: the peak at each length, the ratio to its floor at its longest length, the growth exponent."""
    rows = []
    for name, points in results.items():
        ok = {n: p for n, p in points.items() if isinstance(p, dict)}
        floor_name = "floor-backward" if name in GRADIENT else "floor-forward"
        floor = results.get(floor_name, {}).get(max(ok)) if ok else None
        ratio = "-"
        if isinstance(floor, dict):
            ratio = f"{ok[max(ok)]['peak_mb'] / floor['peak_mb']:.2f} ({floor_name[6:]})"
        slope = exponent(ok)
        cells = [f"{ok[n]['peak_mb']:.0f}" if n in ok else "x" for n in sorted(points)]
        bounded = ", ".join(f"{k}={v}" for k, v in next(iter(ok.values()), {}).get("params", {}).items())
        rows.append((name, " / ".join(cells), ",".join(str(n) for n in sorted(points)), ratio,
                     "-" if slope is None else slope if isinstance(slope, str) else f"{slope:.2f}", bounded or "-"))
    print(table(rows, ("method", "peak RSS (MB)", "lengths", "ratio to floor at longest", "growth exponent",
                       "bounded run's parameters")))


def main() -> None:
    from llmattr import methods

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", default="512,1024,2048,4096,8192")
    parser.add_argument("--methods", default="all", help="comma-separated names (methods, floor-forward, "
                        "floor-backward, evaluator-dynamic, evaluator-fixed), or all")
    parser.add_argument("--path-points", type=int, default=2, help="path points / samples of the bounded path methods")
    parser.add_argument("--full", action="store_true", help="every method with its defaults (no bounded passes)")
    parser.add_argument("--evaluator-lengths", default="1024,4096", help="lengths of the evaluator runs")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--out", help="append every result to this JSON-lines file")
    parser.add_argument("--table", help="print the table of the results saved in this JSON-lines file and exit")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--length", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker, args.length, args.path_points, args.device, args.full)))
        return
    results: dict[str, dict[int, dict | str]] = {}
    if args.table:
        with open(args.table) as handle:
            for line in handle:
                record = json.loads(line)
                results.setdefault(record["name"], {})[record["length"]] = record
        print_table(results)
        return
    lengths = [int(n) for n in args.lengths.split(",")]
    names = [*FLOORS, *methods.available(), *EVALUATOR] if args.methods == "all" else args.methods.split(",")
    evaluator_lengths = [int(n) for n in args.evaluator_lengths.split(",")]
    runs = [(name, n) for name in names for n in (evaluator_lengths if name in EVALUATOR else lengths)]
    print(f"bounded passes: {'no (--full)' if args.full else 'yes, see the docstring'}", flush=True)
    for name, n in runs:
        results.setdefault(name, {})[n] = result = measure(name, n, args)
        shown = result if isinstance(result, str) else f"{result['peak_mb']:.0f} MB in {result['seconds']:.1f} s"
        print(f"{name} @ {n}: {shown}", flush=True)
        if args.out and isinstance(result, dict):
            with open(args.out, "a") as handle:
                handle.write(json.dumps(result) + "\n")
    print_table(results)


if __name__ == "__main__":
    main()
