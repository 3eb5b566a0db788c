"""llmattr vs Inseq on the same model, prompts and answers: median seconds per example.

Inseq is what the papers' baselines were computed with and what most of our users run today. It is not a
dependency of llmattr; install it to run this comparison (``pip install inseq``; 0.7.1 works with
transformers 5.x for the gradient methods and attention). Both sides wrap the same loaded SmolLM2 object and
explain the same forced answer (Inseq: ``attribute(prompt, prompt + answer)``, which re-tokenises to the
same ids here), the target probability, with the same settings (Inseq's baseline, the unk token's
embedding: llmattr's ``baseline="unk"``). The last column checks the scores agree on the first example
(max difference over the content span relative to Inseq's largest score):

* classification: the sentiment prompt of 10 SST-2 sentences, one explained token (llmattr's answer);
* generation: 3 SST-2 sentences with the ``generate`` task and a 5-token greedy answer, every token explained
  (Inseq attributes step by step, llmattr shares one forward across the steps).

Inseq attributes every prompt token (its only option for a decoder-only model), llmattr the content span:
that difference is part of what is measured, since it is what each tool computes for a user. A method that
fails inside Inseq is reported with its error and left out. Not compared: Inseq 0.7.1's ``value_zeroing``
fails on transformers 5.23 (a TypeError inside its hooks, which then stay on the model and break every later
forward), its ``lime`` needs scikit-learn, and its ``reagent`` downloads a RoBERTa.
Run: python benchmarks/bench_inseq.py [--n 10 --n-gen 3 --gen-tokens 5 --methods saliency,...]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import warnings

import torch

from _common import generation_arguments, per_example, read_jsonl, table
from llmattr import load_model, methods
from llmattr.api import prepare
from llmattr.request import Request
from llmattr.tasks import get_task

# llmattr method -> (Inseq method, Inseq attribute() kwargs, llmattr parameters, token reduction of Inseq's
# (tokens, steps, d) attributions for the agreement check; None: not compared, random or differently read)
PAIRS = {
    "saliency": ("saliency", {}, {}, "l2"),
    "input-x-gradient": ("input_x_gradient", {}, {}, "sum"),
    "integrated-gradients": ("integrated_gradients", {"n_steps": 16, "internal_batch_size": 16},
                             {"n_steps": 16, "baseline": "unk"}, "sum"),
    # Captum's DeepLift on a Llama = (x - x0) x gradient, with Inseq's unk baseline
    "deeplift-ixg": ("deeplift", {}, {"baseline": "unk"}, "sum"),
    "gradient-shap": ("gradient_shap", {"n_samples": 5}, {"n_samples": 5, "baseline": "unk"}, None),
    "attention": ("attention", {}, {}, None),
}
GEN_METHODS = ("saliency", "input-x-gradient", "integrated-gradients")


def inseq_fn(model, lm, target, kwargs):
    """Inseq attributing ``target``'s explained tokens as a forced continuation of its prompt."""
    prompt = lm.tokenizer.decode(target.prompt.input_ids[0])
    answer = lm.tokenizer.decode(target.target_ids)
    return lambda: model.attribute(prompt, prompt + answer, show_progress=False, skip_special_tokens=False,
                                   **kwargs)


def agreement(lm, target, name, inseq_model) -> str:
    """Max |llmattr - Inseq| over the content span and steps, relative to Inseq's largest score."""
    inseq_name, kwargs, params, reduction = PAIRS[name]
    if reduction is None:
        return ""
    ours = methods.get(name, **params).attribute(lm, target)  # (T, n)
    seq = inseq_fn(inseq_model, lm, target, kwargs)().sequence_attributions[0]
    raw = seq.target_attributions.float()  # (prompt + answer tokens, T, d)
    theirs = (raw.norm(dim=-1) if reduction == "l2" else raw.sum(-1))[target.span[0]:target.span[1]].T
    return f"{float((ours - theirs).abs().max() / theirs.abs().max()):.1e}"


def compare(lm, targets, names, inseq_models, repeats) -> list[tuple]:
    """Median seconds per example of each pair, interleaved per example (repeats for the runs under 4x the
    first method's time)."""
    times: dict[str, list[float]] = {}
    failed: dict[str, str] = {}
    for i, target in enumerate(targets):
        runs = {}
        for name in names:
            inseq_name, kwargs, params, _ = PAIRS[name]
            runs[name] = lambda m=methods.get(name, **params), t=target: m.attribute(lm, t)
            runs[f"inseq:{inseq_name}"] = inseq_fn(inseq_models[inseq_name], lm, target, kwargs)
        example = per_example(runs, repeats, failed, reference=names[0])
        for key, seconds in example.items():
            times.setdefault(key, []).append(seconds)
        print(f"example {i + 1}/{len(targets)} ({target.input_ids.shape[1]} tokens, {target.n_steps} steps): "
              + ", ".join(f"{k} {s:.3f}" for k, s in example.items()), file=sys.stderr, flush=True)
    for key, error in failed.items():
        print(f"FAILED {key}: {error[:200]}", file=sys.stderr)
    rows = []
    for name in names:
        ours, theirs = times.get(name), times.get(f"inseq:{PAIRS[name][0]}")
        if ours is None:
            continue
        ours_s = statistics.median(ours)
        if theirs is None:
            rows.append((name, f"{ours_s:.3f}", "failed in Inseq", "", ""))
            continue
        theirs_s = statistics.median(theirs)
        agree = agreement(lm, targets[0], name, inseq_models[PAIRS[name][0]])
        rows.append((name, f"{ours_s:.3f}", f"{theirs_s:.3f}", f"{theirs_s / ours_s:.2f}", agree))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=10)
    generation_arguments(parser)
    parser.add_argument("--methods", default=",".join(PAIRS))
    args = parser.parse_args()
    try:
        import inseq
    except ImportError:
        sys.exit("Inseq is not installed: pip install inseq (only this benchmark needs it)")
    warnings.filterwarnings("ignore")
    torch.manual_seed(0)
    lm = load_model("default", device="cpu")
    names = [n for n in args.methods.split(",") if n]
    unknown = [n for n in names if n not in PAIRS]
    if unknown:
        sys.exit(f"no Inseq counterpart for {', '.join(unknown)}; choose from {', '.join(PAIRS)}")
    inseq_models = {PAIRS[n][0]: inseq.load_model(lm.model, PAIRS[n][0], tokenizer=lm.tokenizer) for n in names}

    sentiment = [prepare(lm, text, Request("sentiment")) for text in read_jsonl("sst2", args.n)]
    gen_task = get_task("generate")
    gen_request = Request(gen_task, max_new_tokens=args.gen_tokens)
    gen = [prepare(lm, text, gen_request) for text in read_jsonl("sst2", args.n_gen)]
    header = ("method", "llmattr s/example", "Inseq s/example", "Inseq / llmattr", "max rel. diff (1st example)")
    lengths = [t.input_ids.shape[1] for t in sentiment]
    rows = compare(lm, sentiment, names, inseq_models, args.repeats)
    print(f"{len(sentiment)} SST-2 sentiment prompts (median {statistics.median(lengths):.0f} tokens), one explained "
          f"token, torch threads {torch.get_num_threads()}\n\n{table(rows, header)}\n", flush=True)
    gen_names = [n for n in names if n in GEN_METHODS]
    if gen and gen_names:
        rows = compare(lm, gen, gen_names, inseq_models, 1)
        steps = statistics.median(t.n_steps for t in gen)
        print(f"{len(gen)} generations of {steps:.0f} tokens, every token explained\n\n{table(rows, header)}")


if __name__ == "__main__":
    main()
