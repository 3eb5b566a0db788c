"""Source-level estimators at ``--documents`` documents (issue 34's acceptance): same-run wall times of

* leave-one-out with the prefix cache against the naive leave-one-out (one full forward per removed document,
  nothing shared) and against batched rows without the cache (goal: cached >= 3x faster than naive), beside the
  most the exact cache can save on this input: the tokens naive LOO runs over the tokens the cached one runs
  (:func:`token_bound`; the cache skips the tokens before each removed source, no more);
* our ``contextcite`` against the context-cite package's ``ContextCiter.get_attributions`` on the same model, the
  same prompt token for token and the same 64 masks (goal: no slower), and the largest weight difference;
* AttriBoT's hierarchical search (documents, then the sentences of the ``--top`` documents) against flat
  leave-one-out over every sentence (cached, and naive: AttriBoT's reference), and how many of flat LOO's top-5
  sentences it keeps in its top 5.

The context is the first ``--documents`` BoolQ passages (cut to ``--chars`` characters at a sentence end), each
one source, the query the first row's question, the answer the model's greedy answer (``--tokens``); the prompt
is ContextCite's template (``tests/sources_prompts.py``, which builds the sources by hand). The package's time
excludes its generation (its answer is read before the clock starts). Times are wall times on whatever else the
machine runs: the load average is printed with them.
Run: python benchmarks/bench_sources.py [--documents 20 --chars 600 --tokens 4 --ablations 64 --batch-size auto
--device cpu] (auto: the estimators' default, one row per pass on a CPU)
Small: python benchmarks/bench_sources.py --documents 3 --chars 150 --tokens 2 --ablations 8
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
from pathlib import Path

import nltk
import numpy as np
import torch

from _common import read_jsonl, table
from llmattr import load_model
from llmattr.methods.source_ablation import AUTO
from llmattr.methods.source_estimators import ContextCite, HierarchicalLeaveOneOut, LeaveOneOut
from llmattr.targets import make_target

sys.path.insert(0, str(Path(__file__).parents[1] / "tests"))
from sources_prompts import TEMPLATE, context_prompt  # noqa: E402  (the tests' hand-built sources)

nltk.download = lambda *args, **kwargs: True  # context-cite fetches a sentence splitter at import; unused here
from context_cite import ContextCiter  # noqa: E402
from context_cite.context_partitioner import BaseContextPartitioner  # noqa: E402


def sentences_of(passage: str, chars: int) -> list[str]:
    """The passage's sentences (split after . ! ?), each with its leading space, up to ``chars`` characters."""
    out: list[str] = []
    for part in re.split(r"(?<=[.!?])\s+", passage.strip()):
        if out and sum(map(len, out)) + len(part) + 1 > chars:
            break
        out.append(" " + part)
    return out


class Documents(BaseContextPartitioner):
    """The package's partitioner over our documents: the context is their concatenation."""

    def __init__(self, documents: list[str]):
        super().__init__("".join(documents))
        self.documents = documents

    @property
    def num_sources(self) -> int:
        return len(self.documents)

    def split_context(self) -> None:
        pass

    def get_source(self, index: int) -> str:
        return self.documents[index]

    def get_context(self, mask=None) -> str:
        mask = [True] * len(self.documents) if mask is None else mask
        return "".join(d for d, keep in zip(self.documents, mask, strict=True) if keep)


def clock(lm, fn):
    """Seconds and result of ``fn()``, started with nothing kept on ``lm`` (the estimators keep each ablation's
    result for later calls: a second run would read the first's)."""
    lm.forget()
    start = time.perf_counter()
    result = fn()
    return time.perf_counter() - start, result


def token_bound(target) -> tuple[int, int]:
    """Tokens leave-one-out runs naive and with the cache: both run the clean input (``L`` tokens) once; without
    source ``i`` (``n_i`` tokens from position ``s_i``) naive runs ``L - n_i`` tokens, the cache ``L - n_i - s_i``."""
    length = target.input_ids.shape[1]
    groups = target.prompt.sources.groups
    naive = length + sum(length - len(g) for g in groups)
    return naive, naive - sum(g[0] for g in groups)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--documents", type=int, default=20)
    parser.add_argument("--chars", type=int, default=600, help="characters kept of each passage")
    parser.add_argument("--tokens", type=int, default=4, help="answer tokens (greedy)")
    parser.add_argument("--batch-size", type=lambda v: v if v == AUTO else int(v), default=AUTO)
    parser.add_argument("--top", type=int, default=2, help="documents the hierarchy searches sentence by sentence")
    parser.add_argument("--ablations", type=int, default=64, help="ContextCite's random masks (the package's 64)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--model", default="default")
    args = parser.parse_args()
    torch.manual_seed(0)
    lm = load_model(args.model, device=args.device)
    passages = read_jsonl("boolq", args.documents, "passage")
    query = read_jsonl("boolq", 1, "question")[0]
    split = [sentences_of(p, args.chars) for p in passages]
    documents = ["".join(s) for s in split]
    prompt = context_prompt(lm.tokenizer, documents, query)
    target = make_target(lm, prompt, args.tokens)
    print(f"{args.documents} documents, {prompt.length} prompt tokens, {target.n_steps} answer tokens, "
          f"{sum(map(len, split))} sentences; model {args.model} on {args.device}")
    LeaveOneOut(batch_size=args.batch_size).scores(lm, target)  # warm-up
    b = args.batch_size
    naive_tokens, cached_tokens = token_bound(target)
    naive_s, naive = clock(lm, lambda: LeaveOneOut(prefix="none", batch_size=1).scores(lm, target))
    batched_s, batched = clock(lm, lambda: LeaveOneOut(prefix="none", batch_size=b).scores(lm, target))
    cached_s, cached = clock(lm, lambda: LeaveOneOut(batch_size=b).scores(lm, target))
    rows = [["leave-one-out, naive (1 full forward per document)", f"{naive_s:.2f}", "1.00", "-"],
            ["leave-one-out, batched, no cache", f"{batched_s:.2f}", f"{naive_s / batched_s:.2f}",
             f"{float((batched - naive).abs().max()):.1e}"],
            ["leave-one-out, prefix cache (goal >= 3x)", f"{cached_s:.2f}", f"{naive_s / cached_s:.2f}",
             f"{float((cached - naive).abs().max()):.1e}"],
            ["  the most an exact cache saves here (tokens naive / cached)", "-",
             f"{naive_tokens / cached_tokens:.2f}", f"{naive_tokens} / {cached_tokens} tokens"]]

    citer = ContextCiter(lm.model, lm.tokenizer, "".join(documents), query, partitioner=Documents(documents),
                         prompt_template=TEMPLATE, generate_kwargs={"max_new_tokens": args.tokens, "do_sample": False},
                         num_ablations=args.ablations)
    citer._cache["output"] = citer._get_prompt_ids(return_prompt=True)[1] + lm.tokenizer.decode(target.target_ids)
    same = citer._get_prompt_ids() == prompt.input_ids[0].tolist() and list(citer._response_ids) == \
        target.target_ids.tolist()
    ours = ContextCite(batch_size=b, num_ablations=args.ablations)
    package_s, theirs = clock(lm, lambda: citer.get_attributions(verbose=False))
    ours_s, (weights, _) = clock(lm, lambda: ours.fit(lm, target))
    package = f"contextcite, the package ({args.ablations} masks, batch_size 1: its default)"
    rows += [[package, f"{package_s:.2f}", "-", "-"],
             ["contextcite, ours (goal: no slower than the package)", f"{ours_s:.2f}",
              f"{package_s / ours_s:.2f} vs package", f"{float(np.abs(weights.numpy() - theirs).max()):.1e}"]]
    if not same:
        print("warning: the package's prompt or answer tokens differ from ours; the weights are not comparable")

    sentence_prompt = context_prompt(lm.tokenizer, [], query, sentences=split)
    sentence_target = make_target(lm, sentence_prompt, args.tokens)
    flat_naive_s, _ = clock(lm, lambda: LeaveOneOut(prefix="none", batch_size=1).scores(lm, sentence_target))
    flat_s, flat = clock(lm, lambda: LeaveOneOut(batch_size=b).scores(lm, sentence_target))
    hier_s, hier = clock(lm, lambda: HierarchicalLeaveOneOut(batch_size=b, top_documents=args.top)
                         .scores(lm, sentence_target))
    k = min(5, flat.shape[1])
    kept = len(set(flat.sum(0).topk(k).indices.tolist()) & set(hier.sum(0).topk(k).indices.tolist()))
    rows += [["leave-one-out over sentences, naive", f"{flat_naive_s:.2f}", "-", "-"],
             ["leave-one-out over sentences, flat (cache)", f"{flat_s:.2f}", "1.00", "-"],
             [f"attribot-hierarchical, top {args.top} documents (cache)", f"{hier_s:.2f}",
              f"{flat_s / hier_s:.2f} vs flat, {flat_naive_s / hier_s:.2f} vs naive", f"top-{k} kept: {kept}/{k}"]]
    print(table(rows, ("estimator", "seconds", "speed-up", "max |diff| / agreement")))
    print(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
