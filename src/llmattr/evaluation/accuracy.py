"""Task accuracy of a model: the label word it ranks highest (label-word argmax), batched."""

from __future__ import annotations

from ..errors import LlmattrError
from ..lazy import torch
from ..models.forward import padded_last_probs
from ..prompting import build_prompt
from ..tasks import Task


def label_predictions(lm, task: Task, examples: list[dict], demonstrations: str = "",
                      batch_size: int = 8) -> torch.Tensor:
    """``(n,)`` index of the highest-probability label word at the first answer position of each example.

    The prompts are left-padded into batches of ``batch_size`` (one forward per batch, logits at the
    last position only).
    """
    if not examples:
        raise LlmattrError("no examples to score")
    label_ids = task.label_ids(lm.tokenizer)
    prompts = [build_prompt(lm.tokenizer, task, ex, demonstrations).input_ids[0] for ex in examples]
    width = max(p.numel() for p in prompts)
    ids = torch.stack([torch.nn.functional.pad(p, (width - p.numel(), 0)) for p in prompts])
    mask = torch.stack([torch.nn.functional.pad(torch.ones_like(p), (width - p.numel(), 0)) for p in prompts])
    probs = padded_last_probs(lm, ids, mask, batch_size)
    return probs[:, label_ids].argmax(-1)


def label_accuracy(lm, task: Task, examples: list[dict], demonstrations: str = "", batch_size: int = 8) -> dict:
    """Accuracy (label-word argmax vs gold) and how often each label word is predicted."""
    pred = label_predictions(lm, task, examples, demonstrations, batch_size)
    gold = torch.tensor([task.label_words.index(ex["label"]) for ex in examples])
    return {"n": len(examples), "accuracy": float((pred == gold).double().mean()),
            "predicted": {w: int((pred == i).sum()) for i, w in enumerate(task.label_words)}}
