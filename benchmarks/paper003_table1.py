"""Paper 003's Table 1 (and Tables 4-6, Figures 2-3) on a model fine-tuned with ``llmattr finetune --head``.

    python benchmarks/paper003_table1.py --model sst2-head-dir --n 50 --out sst2.json [--figure sst2.png]
    python benchmarks/paper003_table1.py --store sst2-head.sqlite --dataset sst2-head   # an evaluate store's table

Reads the folder's model card, keeps only its held-out rows (never trained on: not their ids, not their text),
draws ``--n`` of them (balanced per class for a classifier), prints the head's accuracy on them (or Pearson's r)
against the majority rate (a constant predictor), then runs every method of
:data:`llmattr.faithfulness.head.HEAD_METHODS` and paper 003's comprehensiveness and sufficiency at K = 10..90%
(:mod:`llmattr.faithfulness.head`), and prints the ratio-averaged values with 95% bootstrap intervals and the
paired p-values against NormXLogit and the random control; ``--out`` keeps everything as JSON, ``--figure`` draws
the curves over K (Figures 2-3) with the report's figure function.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sqlite3
import time
from collections import defaultdict
from dataclasses import replace
from pathlib import Path

import numpy as np

from llmattr.faithfulness.head import (
    BOOTSTRAP,
    HEAD_METHODS,
    HeadFaithfulness,
    explain_examples,
    summarize,
)
from llmattr.faithfulness.ranking import COMP_ACC, COMP_CD, SUFF_ACC, SUFF_CD
from llmattr.faithfulness.ranks import K_GRID
from llmattr.finetuning import FinetuneConfig, read_examples
from llmattr.models.card import content_hash, read_card
from llmattr.models.loading import load_model
from llmattr.plotting import method_colors
from llmattr.report.figures import curve_band, plot_curves
from llmattr.stats import pearson_curve
from llmattr.tasks.datasets import sample

NAMES = {"normxlogit": "NormXLogit", "logat": "LogAt", "l2-norm": "l2 norm", "saliency": "Grad. Norm",
         "input-x-gradient": "GxI", "integrated-gradients": "IG", "random": "Random"}
CRITERIA = {"comprehensiveness": "Comp CD ↑", "comprehensiveness_acc": "Comp Acc ↓",
            "sufficiency": "Suff CD ↓", "sufficiency_acc": "Suff Acc ↑"}


def held_out_rows(folder: str, n: int, seed: int) -> tuple:
    """The task and ``n`` rows of the fine-tune's held-out split (drawn with ``seed``, balanced per class)."""
    card = read_card(folder)
    if card is None or card.get("status") != "done":
        raise SystemExit(f"{folder} is not a finished llmattr finetune")
    fields = {f.name for f in dataclasses.fields(FinetuneConfig)}
    cfg = FinetuneConfig(**{k: v for k, v in card["settings"].items() if k in fields})
    task, examples, _ = read_examples(cfg, cfg.validate())  # the rows the fine-tune split, read as it read them
    held_ids, trained = set(card["held_out_ids"]), set(card["train_hashes"])
    rows = [ex for ex in examples if ex["id"] in held_ids and content_hash(task.user_content(ex)[0]) not in trained]
    return task, card, sample(rows, min(n, len(rows)), seed, True, task.classes)


def table(summary: dict) -> str:
    """The ratio-averaged values as a markdown table: mean [95% CI] (p vs NormXLogit; p vs random)."""
    criteria = [c for c in CRITERIA if c in next(iter(summary["methods"].values()))]
    lines = ["| method | " + " | ".join(CRITERIA[c] for c in criteria) + " |", "|---" * (len(criteria) + 1) + "|"]
    for method, row in summary["methods"].items():
        cells = []
        for c in criteria:
            cell = row[c]
            ps = "; ".join(f"p vs {o} {cell[f'p_vs_{o}']:.3g}" for o in ("normxlogit", "random")
                           if f"p_vs_{o}" in cell)
            cells.append(f"{cell['mean']:.3f} [{cell['low']:.3f}, {cell['high']:.3f}]" + (f" ({ps})" if ps else ""))
        lines.append(f"| {NAMES.get(method, method)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def figure(by_method: dict, gold: list[float], path: str, title: str) -> None:
    """Figures 2-3: every criterion against K, a line per method with its 95% bootstrap band over examples, drawn by
    the report's :func:`llmattr.report.figures.plot_curves` (a regression head: Pearson's r at each K)."""
    regression = next(iter(by_method.values()))[0].predicted is None
    rows = (COMP_ACC, SUFF_ACC) if regression else (COMP_CD, SUFF_CD, COMP_ACC, SUFF_ACC)
    y = np.array(gold, dtype=np.float64)
    panels = []
    for row in rows:
        key = row.metric.removesuffix("_acc")
        bands = {}
        for method, results in by_method.items():
            if regression:
                bands[method] = pearson_curve([getattr(r, f"{key}_pred") for r in results], y, K_GRID, BOOTSTRAP)
                continue
            values = (np.array([getattr(r, f"{key}_pred") for r in results]) == y[:, None] if key != row.metric
                      else np.array([getattr(r, key) for r in results]))
            bands[method] = curve_band({k: dict(enumerate(values[:, j].astype(float))) for j, k in enumerate(K_GRID)},
                                       BOOTSTRAP)
        panels.append((replace(row, title=f"{row.title.split()[0]} Pearson r") if regression else row, bands))
    plot_curves(panels, Path(path), title, "K (ratio of tokens perturbed)", method_colors(by_method), ("random",))


CLASSIFIER_ROWS = ("comprehensiveness", "sufficiency", "comprehensiveness_acc", "sufficiency_acc")
REGRESSION_ROWS = ("comprehensiveness_output", "sufficiency_output")


def from_store(path: str, dataset: str) -> tuple[dict, list[float]]:
    """The ``comp-suff`` rows of a head in an ``llmattr evaluate`` store as :class:`HeadFaithfulness` per method
    (examples that every method holds) and the gold of each example. A classifier: the perturbed prediction's
    correctness as the prediction and gold 1; a regression head: its output at each K and the stored gold score."""
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    cells: dict = defaultdict(lambda: defaultdict(dict))
    gold: dict = {}
    for example, method, metric, x, value in con.execute(
            "SELECT example, method, metric, x, value FROM results WHERE dataset = ?", (dataset,)):
        if metric == "gold_score":
            gold[example] = value
        elif metric in CLASSIFIER_ROWS + REGRESSION_ROWS:
            cells[method][example][metric, x] = value
    if not cells:
        raise SystemExit(f"{path} holds no comp-suff rows of dataset {dataset!r}")
    examples = sorted(set.intersection(*(set(rows) for rows in cells.values())))
    by_method = {}
    for method, rows in cells.items():
        if gold:  # a regression head: the output at each K is both the value and the prediction
            by_method[method] = [HeadFaithfulness(list(K_GRID), None, 0.0, *(2 * [[rows[e][metric, k] for k in K_GRID]
                                                                                   for metric in REGRESSION_ROWS]))
                                 for e in examples]
            continue
        curves = [[[rows[e][metric, k] for k in K_GRID] for metric in CLASSIFIER_ROWS] for e in examples]
        by_method[method] = [HeadFaithfulness(list(K_GRID), 1, 0.0, *four) for four in curves]
    return by_method, [gold[e] for e in examples] if gold else [1.0] * len(examples)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model")
    parser.add_argument("--n", type=int, default=50)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--methods", default=",".join(HEAD_METHODS))
    parser.add_argument("--out")
    parser.add_argument("--figure")
    parser.add_argument("--store", help="read a classifier's comp-suff rows from this llmattr evaluate store "
                                        "(dataset: --dataset) instead of computing them")
    parser.add_argument("--dataset")
    args = parser.parse_args()
    if args.store:
        by_method, gold = from_store(args.store, args.dataset)
        print(f"{args.dataset}: {len(gold)} examples held by every method in {args.store}")
        summary = summarize(by_method, gold)
        print(table(summary))
        if args.figure:
            figure(by_method, gold, args.figure, f"{args.dataset}: comprehensiveness and sufficiency over K "
                                                  f"(n = {len(gold)})")
        return
    task, card, rows = held_out_rows(args.model, args.n, args.seed)
    lm = load_model(args.model, device="cpu")
    load = os.getloadavg()[0]
    start = time.perf_counter()
    run = explain_examples(lm, task, rows, args.methods.split(","),
                           progress=lambda i, n: print(f"\r{i}/{n}", end="", flush=True))
    print()
    gold, clean = np.array(run["gold"]), np.array(run["clean"], dtype=np.float64)
    if task.numeric:
        head = {"pearson": float(np.corrcoef(clean, gold)[0, 1]), "constant": "Pearson r undefined (0 by convention)"}
    else:
        head = {"accuracy": float((clean == gold).mean()),
                "majority": max(np.mean(gold == c) for c in range(len(task.label_words)))}
    print(f"{task.name}: {len(rows)} held-out rows never trained on; the head on them: {head}")
    summary = summarize(run["by_method"], run["gold"])
    print(table(summary))
    seconds = {m: s / len(rows) for m, s in run["seconds"].items()}
    print("seconds per instance (attribution only):", {m: round(s, 3) for m, s in seconds.items()})
    result = {"model": args.model, "task": task.name, "card_held_out": card.get("held_out"), "head_on_rows": head,
              "summary": summary, "seconds_per_instance": seconds, "wall_s": time.perf_counter() - start,
              "load_before": load, "load_after": os.getloadavg()[0], "ids": [ex["id"] for ex in rows],
              "per_example": {m: [r.to_dict() for r in rs] for m, rs in run["by_method"].items()}}
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1))
    if args.figure:
        figure(run["by_method"], run["gold"], args.figure,
               f"{task.name}: comprehensiveness and sufficiency over K (n = {len(rows)})")


if __name__ == "__main__":
    main()
