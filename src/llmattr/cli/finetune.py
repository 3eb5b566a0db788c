"""``llmattr finetune``: teach a model a task's label words in the task's own prompt (docs/finetune.md)."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console

from .app import app


@app.command()
def finetune(
    out: Path = typer.Option(..., help="Folder for the fine-tuned model (save_pretrained + tokenizer + model card); "
                                       "rerunning the same command resumes an interrupted run."),
    model: str = typer.Option("default", help="Base model: 'default' (SmolLM2-135M-Instruct), a hub id, a folder or "
                                              "a .gguf."),
    task: str = typer.Option("sst2", help="Classification task with label words (sst2, imdb, boolq, qnli, mnli, "
                                          "sentiment for your own file)."),
    data: Path = typer.Option(None, help="Your own JSONL/CSV/TSV file (default: the task's sample data)."),
    text_field: str = typer.Option(None, help="--data: the column holding the text (default: the task's field)."),
    label_field: str = typer.Option(None, help="--data: the column holding the label (default: label)."),
    labels: str = typer.Option(None, help="--data: label words, e.g. Positive,Negative, or file value=word pairs, "
                                          "e.g. 0=Negative,1=Positive (default: the task's)."),
    loss: str = typer.Option("label", help="The training loss. label: the label word after the task's prompt; lm: "
                                           "language modelling on the texts (paper 004)."),
    objective: str = typer.Option(None, hidden=True, help="--loss's name before issue 39 (scripts keep working)."),
    held_out: int = typer.Option(80, help="Rows kept out of training (balanced per class) for the held-out accuracy."),
    epochs: int = typer.Option(3, help="Passes over the training rows."),
    learning_rate: float = typer.Option(1e-5, help="AdamW learning rate (linear decay to 0)."),
    batch_size: int = typer.Option(8, help="Rows per optimizer step."),
    max_tokens: int = typer.Option(256, help="Cut each text field to this many tokens (IMDb's length cap)."),
    lora_r: int = typer.Option(None, help="0: full fine-tuning; a rank r >= 1: LoRA adapters (peft), merged at the end "
                                          "(default: 4 with --head, paper 003's recipe; else 0)."),
    head: str = typer.Option(None, help="classification or regression: train a sequence head on the last token's "
                                        "state (paper 003; tasks NAME-head, stsb-regression) instead of label words."),
    load_in_4bit: bool = typer.Option(False, "--load-in-4bit", help="4-bit frozen weights + LoRA (bitsandbytes, "
                                                                    "a CUDA GPU)."),
    permute_labels: bool = typer.Option(False, "--permute-labels", help="Train on the training rows' labels permuted "
                                        "(the data randomisation sanity check's model; held-out rows keep theirs)."),
    mask_augment: float = typer.Option(0.0, help="F-Fidelity's random-mask fine-tuning: each training row loses a "
                                       "random subset of up to this fraction of its text tokens (deleted), new "
                                       "each epoch (0: off; e.g. 0.1; docs/trust.md)."),
    seed: int = typer.Option(0, help="Seed of the split, the data order and the initialisation of adapters."),
    save_steps: int = typer.Option(50, help="Checkpoint every this many steps (resume point after an interrupt)."),
    device: str = typer.Option("auto", help="cpu, cuda or auto."),
    quiet: bool = typer.Option(False, "--quiet", help="No progress bar."),
) -> None:
    """Fine-tune a model on a task; the folder loads with --model DIR everywhere, its card names what it saw."""
    settings = {"held_out": held_out, "epochs": epochs, "learning_rate": learning_rate, "batch_size": batch_size,
                "max_tokens": max_tokens, "lora_r": lora_r, "save_steps": save_steps, "load_in_4bit": load_in_4bit,
                "head": head, "permute_labels": permute_labels, "mask_augment": mask_augment}
    from ..declarations import held_out_summary
    from ..finetuning import FinetuneConfig, plan  # the library's, importing no torch (llmattr.lazy)
    from ..finetuning import finetune as run_finetune

    cfg = FinetuneConfig(task=task, data=None if data is None else str(data), text_field=text_field,
                         label_field=label_field, labels=labels, loss=loss, objective=objective, seed=seed, **settings)
    planned = plan(model, out, cfg)  # every check that needs no model, the library's own, in its order
    console = Console(stderr=True)
    try:
        card = run_finetune(model, out, cfg, device=device, progress=not quiet, planned=planned)
    except KeyboardInterrupt:
        console.print(f"interrupted: rerun the same command to resume from the last checkpoint in {out}/checkpoints",
                      highlight=False, soft_wrap=True)
        raise typer.Exit(130) from None
    held = card.get("held_out")
    result = "held-out {} {}; ".format(*held_out_summary(held)) if held else ""
    console.print(f"{card['task']}: {card['n_train']} training rows, {result}{card['train_seconds'] / 60:.1f} min "
                  f"-> {out} (llmattr evaluate --model {out})", highlight=False, soft_wrap=True)
