"""Fine-tune the embedded model on each task and measure held-out accuracy, time and machine load.

    python benchmarks/bench_finetune.py --tasks sst2 --out /tmp/ft [--figure docs/img/finetune_loss.png]

For each task: ``llmattr.finetune`` with its defaults (3 epochs, AdamW lr 1e-5, batch 8, 80 held-out rows; ``--epochs``
and ``--held-out`` change those two), the
fine-tuned model's held-out accuracy with its 95% bootstrap interval and the majority-class rate, wall time, and
the 1-minute load average before and after (``os.getloadavg``; on a shared machine other work slows the run).
With ``--base``, the base model's accuracy on the same held-out rows afterwards. The loss curves go to one figure.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from llmattr.evaluation.accuracy import label_accuracy  # noqa: E402
from llmattr.finetuning import FinetuneConfig, finetune, read_examples, split  # noqa: E402
from llmattr.models.loading import load_model  # noqa: E402


def base_accuracy(task_name: str, cfg: FinetuneConfig) -> dict:
    """The base model on the held-out rows the fine-tune will keep out."""
    task, examples, _ = read_examples(cfg, cfg.validate())
    _, held = split(task, examples, cfg.held_out, cfg.seed)
    return label_accuracy(load_model("default", device="cpu"), task, held)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tasks", default="sst2")
    parser.add_argument("--out", default="/tmp/llmattr-finetune")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--held-out", type=int, default=FinetuneConfig.held_out,
                        help="rows kept out of training (more: a narrower interval, fewer training rows)")
    parser.add_argument("--figure", default=None)
    parser.add_argument("--base", action="store_true", help="also score the base model on the held-out rows "
                                                            "(after the timed fine-tune)")
    args = parser.parse_args()

    results = {}
    for name in args.tasks.split(","):
        cfg = FinetuneConfig(task=name, epochs=args.epochs, held_out=args.held_out)
        load_before = os.getloadavg()[0]
        start = time.perf_counter()
        card = finetune("default", Path(args.out) / name, cfg, device="cpu")
        minutes = (time.perf_counter() - start) / 60
        held = card["held_out"]
        base = base_accuracy(name, cfg) if args.base else {"accuracy": float("nan"), "predicted": None}
        results[name] = {"base_accuracy": base["accuracy"], "base_predicted": base["predicted"], **held,
                         "n_train": card["n_train"], "minutes": minutes, "train_minutes": card["train_seconds"] / 60,
                         "load_before": load_before, "load_after": os.getloadavg()[0], "cpus": os.cpu_count(),
                         "loss_curve": card["loss_curve"]}
        print(f"{name}: base {base['accuracy']:.3f} {base['predicted']} -> fine-tuned {held['accuracy']:.3f} "
              f"(95% CI {held['low']:.3f}-{held['high']:.3f}, n={held['n']}, majority {held['majority']:.3f}, "
              f"predicted {held['predicted']}); {card['n_train']} training rows, {minutes:.1f} min "
              f"({card['train_seconds'] / 60:.1f} min training) on {os.cpu_count()} CPUs, "
              f"load {load_before:.1f} -> {os.getloadavg()[0]:.1f}", flush=True)
    print(json.dumps({k: {key: v for key, v in r.items() if key != "loss_curve"} for k, r in results.items()}))
    if args.figure:
        fig, ax = plt.subplots(figsize=(6, 3.5))
        for name, r in results.items():
            steps, losses = zip(*r["loss_curve"], strict=True)
            ax.plot(steps, losses, label=f"{name} (held-out accuracy {r['accuracy']:.2f})")
        ax.set_xlabel("optimizer step (batch 8)")
        ax.set_ylabel("training loss (label word)")
        ax.set_title("llmattr finetune on SmolLM2-135M-Instruct")
        ax.legend()
        fig.tight_layout()
        fig.savefig(args.figure, dpi=120)
        print(f"wrote {args.figure}")


if __name__ == "__main__":
    main()
