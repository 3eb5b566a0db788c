"""``llmattr finetune``: teach a model a task's label words in the task's own prompt (docs/finetune.md)."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path

import typer
from rich.console import Console

from ..declarations import held_out_summary
from ..finetuning import FinetuneConfig, plan
from ..finetuning import finetune as run_finetune
from .app import app, command, field_option, own

CONFIG = {f.name: f for f in fields(FinetuneConfig) if "help" in f.metadata}  # the library's settings, written once
OPTIONS = [  # in the order of the help
    own("out", Path, ..., "Folder for the fine-tuned model (save_pretrained + tokenizer + model card); rerunning the "
                          "same command resumes an interrupted run."),
    own("model", str, "default", "Base model: 'default' (SmolLM2-135M-Instruct), a hub id, a folder or a .gguf."),
    *(field_option(CONFIG[name]) for name in ("task", "data", "text_field", "label_field", "labels", "loss")),
    own("objective", str, None, "--loss's name before issue 39 (scripts keep working).", hidden=True),
    *(field_option(CONFIG[name]) for name in ("held_out", "epochs", "learning_rate", "batch_size", "max_tokens",
                                               "lora_r", "head", "load_in_4bit", "permute_labels", "mask_augment",
                                               "seed", "save_steps")),
    own("device", str, "auto", "cpu, cuda or auto."),
    own("quiet", bool, False, "No progress bar.", "--quiet"),
]


@app.command()
@command(OPTIONS)
def finetune(ctx: typer.Context, **given) -> None:
    """Fine-tune a model on a task; the folder loads with --model DIR everywhere, its card names what it saw."""
    out, model = given["out"], given["model"]
    cfg = FinetuneConfig(objective=given["objective"], **{name: str(given[name]) if isinstance(given[name], Path)
                                                           else given[name] for name in CONFIG})
    planned = plan(model, out, cfg)  # every check that needs no model, the library's own, in its order: no torch yet
    console = Console(stderr=True)
    try:
        card = run_finetune(model, out, cfg, device=given["device"], progress=not given["quiet"], planned=planned)
    except KeyboardInterrupt:
        console.print(f"interrupted: rerun the same command to resume from the last checkpoint in {out}/checkpoints",
                      highlight=False, soft_wrap=True)
        raise typer.Exit(130) from None
    held = card.get("held_out")
    result = "held-out {} {}; ".format(*held_out_summary(held)) if held else ""
    console.print(f"{card['task']}: {card['n_train']} training rows, {result}{card['train_seconds'] / 60:.1f} min "
                  f"-> {out} (llmattr evaluate --model {out})", highlight=False, soft_wrap=True)
