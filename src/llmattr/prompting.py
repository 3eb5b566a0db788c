"""Turn (task, example) into token ids, with the content span located by character offsets."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .errors import LlmattrError
from .tasks import Task


@dataclass
class Prompt:
    """A rendered prompt: its text, token ids, per-token character offsets and the content span."""

    text: str
    input_ids: torch.Tensor  # (1, P)
    offsets: list[tuple[int, int]]
    span: tuple[int, int]  # [start, end) token indices of the content span
    char_span: tuple[int, int]

    @property
    def length(self) -> int:
        return self.input_ids.shape[1]


def _chat_text(tokenizer, system: str | None, user: str) -> str:
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": user}]
    try:
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    except Exception:  # templates without a system role (e.g. some Mistral): fold it into the user turn
        if not system:
            raise
        merged = [{"role": "user", "content": f"{system}\n\n{user}"}]
        return tokenizer.apply_chat_template(merged, tokenize=False, add_generation_prompt=True)


def render(tokenizer, task: Task, example: dict, demonstrations: str = "") -> tuple[str, tuple[int, int]]:
    """The prompt string and the character range of the content span inside it.

    With a chat template the prompt ends with the assistant header (``add_generation_prompt``), which
    is the forced header of paper 000 appendix D for Llama-3 templates. ``demonstrations`` (few-shot
    text) is placed in the user turn before the content, so it is never attributed or perturbed.
    """
    user, (start, end) = task.user_content(example)
    user = demonstrations + user
    start, end = start + len(demonstrations), end + len(demonstrations)
    if task.uses_chat(tokenizer):
        text = _chat_text(tokenizer, task.system, user)
        where = text.rfind(user)
        if where < 0:
            raise LlmattrError("the chat template changed the user text; cannot locate the content span")
    else:
        bos = tokenizer.bos_token or ""
        head = bos + (task.system + "\n\n" if task.system else "")
        tail = ("\n" + task.answer_prefix) if task.answer_prefix else ""
        text = head + user + tail
        where = len(head)
    return text, (where + start, where + end)


def tokenize_prompt(tokenizer, text: str, char_span: tuple[int, int]) -> Prompt:
    """Tokenise without adding special tokens (the template has them: no doubled BOS)."""
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    offsets = [tuple(o) for o in enc["offset_mapping"]]
    a, b = char_span
    inside = [i for i, (s, e) in enumerate(offsets) if e > s and s < b and e > a]
    if not inside:
        raise LlmattrError("the content span is empty after tokenisation; give a non-empty text")
    return Prompt(
        text=text, input_ids=torch.tensor([enc["input_ids"]]), offsets=offsets,
        span=(inside[0], inside[-1] + 1), char_span=char_span,
    )


def build_prompt(tokenizer, task: Task, example: dict, demonstrations: str = "") -> Prompt:
    text, char_span = render(tokenizer, task, example, demonstrations)
    return tokenize_prompt(tokenizer, text, char_span)
