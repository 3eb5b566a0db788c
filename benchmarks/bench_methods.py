"""Median seconds per example of every registered method, the floor, a single forward and Captum's IG.

Embedded model on the CPU; 10 short SST-2 sentences and 3 long IMDb reviews from llmattr/data,
sentiment task (one explained token). In the same run:

* floor: one forward + backward to the input embeddings; single forward: one no-grad forward;
* the n-step floor of a path method (IG, IGCG, AIEG: ``n_steps``; GradientSHAP: ``n_samples``): n forward +
  backward passes of the input batched as rows, in the chunks the memory guard gives the method
  (:func:`llmattr.models.memory.path_batch`), logits at the explained position; ``input``: every token
  differentiated (what completeness over every token, the convergence delta, needs under the default zero baseline
  of every token), ``span``: the template before the content span run once into a key/value cache without
  gradients (what a method that attributes the span alone would need);
* Captum ``LayerIntegratedGradients`` on the embedding layer (n_steps=16, internal_batch_size=8) with the
  usual user forward (``model(input_ids).logits[:, -1]``, softmax, target id) and Captum
  ``IntegratedGradients`` on llmattr's own embedding-level function (logits at the target position only);
* a 5-token generation: every gradient method with its shared forward vs. the same method run once per
  step (one forward + backward per step, each step its own prefix).

Every target is judged on the median over examples of the per-example ratio (the method and its baseline timed on
the same example in interleaved rounds, a paired comparison); the table also shows the ratio of the two medians,
which compares different examples when the lengths vary. Targets (issues 4 and 24): normxlogit <= 1.2x single
forward; saliency, input-x-gradient, grad-ellm <= 1.05x
floor (AttnLRP, CP-LRP: one backward under their rules, issue 23: <= 1.2x); integrated-gradients >= 1.75x faster
than Captum LIG; IG, IGCG, GradientSHAP <= 1.2x their n-step floor of the span, AIEG of the input (its PosNorm
needs every token's attribution); gradient methods >= 1.25x faster than per step. The path methods keep the
template's keys and values at each path point for the task's next example (``LoadedModel.kept``): the warm-up
example and the repeats fill it, as the first example of an evaluation does.
Run: python benchmarks/bench_methods.py [--n-short 10 --n-long 3 --n-gen 3 --methods a,b]
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys

import torch
from captum.attr import IntegratedGradients, LayerIntegratedGradients

from _common import floor_fn, generation_arguments, once, per_example, read_jsonl, table
from llmattr import load_model, methods
from llmattr.api import prepare
from llmattr.methods.gradient import score_fn
from llmattr.models.memory import path_batch
from llmattr.request import Request
from llmattr.targets import Target
from llmattr.tasks import get_task

TARGETS = {"normxlogit": ("forward", 1.2), "saliency": ("floor", 1.05), "input-x-gradient": ("floor", 1.05),
           "grad-ellm": ("floor", 1.05), "attnlrp": ("floor", 1.2), "cp-lrp": ("floor", 1.2)}
PATH_POINTS = {"integrated-gradients": "n_steps", "igcg": "n_steps", "aieg": "n_steps", "gradient-shap": "n_samples"}
PATH_TARGET = 1.2
# the n-step floor each path method is held to: the span for the methods that report the span alone (the template's
# share of their convergence delta goes through its cached keys and values); the whole input for AIEG, whose PosNorm
# divides by the positive attributions of every token the step sees, the template's included (paper 004 eq. 13)
PATH_FLOOR = {"integrated-gradients": "span", "igcg": "span", "gradient-shap": "span", "aieg": "input"}
CAPTUM_TARGET = 1.75


def forward_fn(lm, target):
    def run():
        with torch.no_grad():
            lm.model(inputs_embeds=lm.embed(target.input_ids), logits_to_keep=1, use_cache=False)
    return run


def path_floor_fn(lm, target, n: int, span: bool):
    """The n-step floor: n forward + backward passes of the input as batch rows (chunks of the memory guard's path
    batch), logits at the explained positions; ``span``: the template before the content span as a no-gradient
    key/value cache (where the guard finds the cache pays, as the methods do)."""
    x = lm.embed(target.input_ids).detach()
    f = score_fn(lm, target, "logit", target.span[0] if span else 0)
    rows = path_batch(lm, x.shape[1], n)

    def run():
        for start in range(0, n, rows):
            embeds = x.expand(min(rows, n - start), -1, -1).clone().requires_grad_(True)
            torch.autograd.grad(f(embeds).sum(), embeds)
    return run


def path_points(method) -> int | None:
    key = PATH_POINTS.get(method.name)
    return None if key is None else int(method.params[key])


def captum_lig_fn(lm, target):
    """What a Captum user writes: LIG on the embedding layer, full logits, softmax of the last position."""
    def forward(ids):
        return torch.softmax(lm.model(input_ids=ids, use_cache=False).logits[:, -1].float(), -1)

    lig = LayerIntegratedGradients(forward, lm.model.get_input_embeddings())
    ids = target.input_ids.to(lm.device)
    tid = int(target.target_ids[-1])
    return lambda: lig.attribute(ids, baselines=torch.zeros_like(ids), target=tid, n_steps=16,
                                 internal_batch_size=8)


def captum_ig_embed_fn(lm, target):
    """Captum IG on llmattr's embedding-level function (logits at the explained position only)."""
    f = score_fn(lm, target, "probability")
    ig = IntegratedGradients(lambda e: f(e)[:, -1])
    x = lm.embed(target.input_ids).detach()
    return lambda: ig.attribute(x, baselines=torch.zeros_like(x), n_steps=16, internal_batch_size=8)


def one_step_targets(target: Target) -> list[Target]:
    """Step t as its own single-step target (prompt + the first t explained tokens as prefix)."""
    out = []
    for t in range(target.n_steps):
        ids = torch.cat([target.prompt.input_ids[0], target.target_ids[:t]])[None]
        prompt = dataclasses.replace(target.prompt, input_ids=ids)
        out.append(Target(prompt, target.target_ids[t:t + 1], forced=True))
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n-short", type=int, default=10)
    parser.add_argument("--n-long", type=int, default=3)
    generation_arguments(parser)
    parser.add_argument("--long-chars", type=int, default=1500, help="IMDb reviews cut to this many characters")
    parser.add_argument("--methods", default="", help="comma-separated subset (default: every registered method)")
    parser.add_argument("--gen-methods", default="", help="subset for the generation table (default: every "
                        "gradient method among --methods)")
    args = parser.parse_args()
    torch.manual_seed(0)
    lm = load_model("default", device="cpu")
    names = [m for m in args.methods.split(",") if m] or methods.available()
    objs = {name: methods.get(name) for name in names}
    task = get_task("sentiment")
    texts = read_jsonl("sst2", args.n_short) + [t[: args.long_chars] for t in read_jsonl("imdb", args.n_long)]
    targets = [prepare(lm, text, Request(task)) for text in texts]

    warm = prepare(lm, "A fine film.", Request(task))
    for fn in [floor_fn(lm, warm), forward_fn(lm, warm), captum_lig_fn(lm, warm), captum_ig_embed_fn(lm, warm),
               *[lambda m=m: m.attribute(lm, warm) for m in objs.values()]]:
        fn()

    points = sorted({n for n in map(path_points, objs.values()) if n})
    times: dict[str, list[float]] = {}
    examples: list[dict[str, float]] = []
    failed: dict[str, str] = {}
    for i, target in enumerate(targets):
        runs = {"floor": floor_fn(lm, target), "forward": forward_fn(lm, target),
                "captum-lig": captum_lig_fn(lm, target), "captum-ig-embed": captum_ig_embed_fn(lm, target)}
        for n in points:
            runs[f"floor-{n} input"] = path_floor_fn(lm, target, n, span=False)
            runs[f"floor-{n} span"] = path_floor_fn(lm, target, n, span=True)
        runs.update({name: (lambda m=m, t=target: m.attribute(lm, t)) for name, m in objs.items()})
        example = per_example(runs, args.repeats, failed)
        examples.append(example)
        for name, seconds in example.items():
            times.setdefault(name, []).append(seconds)
        print(f"example {i + 1}/{len(targets)} ({target.input_ids.shape[1]} tokens): "
              + ", ".join(f"{n} {s:.3f}" for n, s in example.items()), file=sys.stderr, flush=True)
    for name, error in failed.items():
        print(f"FAILED {name}: {error}", file=sys.stderr)
    names = [n for n in names if n in times]
    med = {name: statistics.median(v) for name, v in times.items()}

    def paired(name: str, reference: str) -> float:
        """Median over examples of ``name``'s seconds / ``reference``'s on the same example."""
        return statistics.median(e[name] / e[reference] for e in examples if name in e and reference in e)
    lengths = [t.input_ids.shape[1] for t in targets]
    print(f"{len(targets)} examples ({args.n_short} SST-2, {args.n_long} IMDb), prompt tokens median "
          f"{statistics.median(lengths):.0f} (min {min(lengths)}, max {max(lengths)}), torch threads "
          f"{torch.get_num_threads()}\n")
    rows = []
    floors = [f"floor-{n} {kind}" for n in points for kind in ("input", "span")]
    for name in ["forward", "floor", *floors, "captum-lig", "captum-ig-embed", *names]:
        goal = TARGETS.get(name)
        notes = []
        if goal:
            ratio = paired(name, goal[0])
            verdict = "met" if ratio <= goal[1] else "MISSED"
            notes.append(f"{ratio:.2f}x {goal[0]} paired: target <= {goal[1]} {verdict}")
        n = path_points(objs[name]) if name in objs else None
        by_points = ("", "")
        if n:
            by_points = tuple(f"{med[name] / med[f'floor-{n} {kind}']:.2f}" for kind in ("input", "span"))
            kind = PATH_FLOOR[name]
            ratio = paired(name, f"floor-{n} {kind}")
            notes.append(f"{ratio:.2f}x n-floor {kind} paired (n={n}): target <= {PATH_TARGET} "
                         f"{'met' if ratio <= PATH_TARGET else 'MISSED'}")
        if name == "integrated-gradients":
            ratio = 1 / paired(name, "captum-lig")
            notes.append(f"Captum LIG / this = {ratio:.2f} paired: target >= {CAPTUM_TARGET} "
                         f"{'met' if ratio >= CAPTUM_TARGET else 'MISSED'}")
        rows.append((name, f"{med[name]:.3f}", f"{med[name] / med['floor']:.2f}", f"{med[name] / med['forward']:.2f}",
                     *by_points, "; ".join(notes)))
    print(table(rows, ("method", "median s/example", "x floor", "x forward", "x n-floor input", "x n-floor span",
                       "note")), flush=True)

    gen_task = get_task("generate")
    gen_names = [n for n in args.gen_methods.split(",") if n] or [n for n in names if objs[n].needs_gradients]
    gen_request = Request(gen_task, max_new_tokens=args.gen_tokens)
    gen = [prepare(lm, text, gen_request) for text in read_jsonl("sst2", args.n_gen)]
    shared, split = {}, {}
    for target in gen:
        steps = one_step_targets(target)
        split.setdefault("floor", []).append(sum(once(floor_fn(lm, s)) for s in steps))
        for name in gen_names:
            m = objs.get(name) or methods.get(name)
            shared.setdefault(name, []).append(once(lambda m=m, t=target: m.attribute(lm, t)))
            split.setdefault(name, []).append(sum(once(lambda m=m, s=s: m.attribute(lm, s)) for s in steps))
            print(f"generation {len(shared[name])}/{len(gen)} {name}: shared {shared[name][-1]:.3f} s, per step "
                  f"{split[name][-1]:.3f} s", file=sys.stderr, flush=True)
    n_steps = [t.n_steps for t in gen]
    print(f"\n{len(gen)} generations of {statistics.median(n_steps):.0f} tokens (median): shared forward vs "
          f"one forward + backward per step (the floor once per step: {statistics.median(split['floor']):.3f} s)\n")
    rows = []
    for n in gen_names:
        speedup = statistics.median(split[n]) / statistics.median(shared[n])
        rows.append((n, f"{statistics.median(shared[n]):.3f}", f"{statistics.median(split[n]):.3f}",
                     f"{speedup:.2f} {'met' if speedup >= 1.25 else 'MISSED'}"))
    print(table(rows, ("method", "shared s/example", "per-step s/example", "speed-up (target >= 1.25)")))


if __name__ == "__main__":
    main()
