"""Turn (task, example) into token ids, with the content span located by character offsets."""

from __future__ import annotations

from dataclasses import dataclass

from .errors import LlmattrError
from .lazy import torch
from .sources import Sources
from .sources.build import build_sources, check_documents, check_spans, context_text
from .tasks import Task


@dataclass
class Prompt:
    """A rendered prompt: its text, token ids, per-token character offsets and the content span."""

    text: str
    input_ids: torch.Tensor  # (1, P)
    offsets: list[tuple[int, int]]
    span: tuple[int, int]  # [start, end) token indices of the content span
    char_span: tuple[int, int]
    sources: Sources | None = None  # which tokens form each source (documents, sentences), when the input has them

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


def _encode(tokenizer, text: str, shift: int = 0, as_text: bool = False) -> tuple[list[int], list[tuple[int, int]]]:
    """Ids and character offsets (moved by ``shift``); ``as_text`` reads special-token strings as plain text."""
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True, split_special_tokens=as_text)
    return list(enc["input_ids"]), [(s + shift, e + shift) for s, e in enc["offset_mapping"]]


def special_ids(tokenizer) -> set[int]:
    """Ids of the tokenizer's control tokens (``<|im_end|>``, ``<start_of_turn>``, BOS/EOS, ...)."""
    added = getattr(tokenizer, "added_tokens_decoder", {}) or {}
    return set(tokenizer.all_special_ids) | {i for i, token in added.items() if getattr(token, "special", False)}


def tokenize_prompt(tokenizer, text: str, char_span: tuple[int, int]) -> Prompt:
    """Tokenise without adding special tokens (the template has them: no doubled BOS).

    A control-token string typed inside the content span (``<|im_end|>`` in the user's text) is tokenised
    as plain text there, never as the control token: the user's text cannot close the chat turn. Only
    then is the span tokenised apart from the template around it.
    """
    ids, offsets = _encode(tokenizer, text)
    a, b = char_span
    inside = [i for i, (s, e) in enumerate(offsets) if e > s and s < b and e > a]
    if inside and special_ids(tokenizer) & set(ids[inside[0]: inside[-1] + 1]):
        parts = [_encode(tokenizer, text[:a]), _encode(tokenizer, text[a:b], a, as_text=True),
                 _encode(tokenizer, text[b:], b)]
        ids, offsets = [i for p in parts for i in p[0]], [o for p in parts for o in p[1]]
        first = len(parts[0][0])
        inside = list(range(first, first + len(parts[1][0])))
    if not inside:
        raise LlmattrError("the content span is empty after tokenisation; give a non-empty text")
    return Prompt(
        text=text, input_ids=torch.tensor([ids]), offsets=offsets,
        span=(inside[0], inside[-1] + 1), char_span=char_span,
    )


def decode_pieces(tokenizer, ids: list[int]) -> list[str]:
    """Each token's own text such that the pieces join to ``decode(ids)``.

    Decoding tokens one by one splits a multi-byte character (Arabic, CJK, emoji) into replacement
    characters ``\ufffd``; here a token that ends inside a character shows nothing and the character is
    shown on the token that completes it.
    """
    pieces, done = [], ""
    for n in range(1, len(ids) + 1):
        text = tokenizer.decode(ids[:n])
        if text.endswith("\ufffd") and n < len(ids):
            pieces.append("")
            continue
        pieces.append(text[len(done):] if text.startswith(done) else tokenizer.decode(ids[n - 1: n]))
        done = text
    return pieces


def source_ranges(task: Task, example: dict, granularity: str | None) -> list[tuple[int, int]] | None:
    """The sources' character ranges relative to the content span's start: each document's text (a task that
    takes ``documents``), the example's ``spans`` (ranges into its first field, the text), or with
    ``granularity="sentence"`` and neither, the whole text (then split into sentences); None: no sources."""
    if task.documents:
        return context_text(check_documents(example["documents"]))[1]
    text = str(example[task.fields[0]])
    if example.get("spans") is not None:
        return list(check_spans(example["spans"], len(text)))
    return [(0, len(text))] if granularity == "sentence" else None


def build_prompt(tokenizer, task: Task, example: dict, demonstrations: str = "", sources: str | None = None,
                 language: str = "en") -> Prompt:
    """The prompt of ``example``, with its :class:`~llmattr.sources.Sources` where it has documents or spans (or
    ``sources="sentence"``): one per document or span, or one per sentence of each (``sources``); the example's
    ``gold_sources`` (document indices) are the gold ones."""
    text, char_span = render(tokenizer, task, example, demonstrations)
    prompt = tokenize_prompt(tokenizer, text, char_span)
    ranges = source_ranges(task, example, sources)
    if ranges is not None:
        names = (None if task.documents else ["text"] if example.get("spans") is None
                 else [f"span {i}" for i in range(1, len(ranges) + 1)])
        prompt.sources = build_sources([(char_span[0] + s, char_span[0] + e) for s, e in ranges], text,
                                       prompt.offsets, prompt.span, sources or "document",
                                       example.get("gold_sources") or (), language, names)
    return prompt
