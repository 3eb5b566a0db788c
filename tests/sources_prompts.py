"""Prompts with sources built by hand for the source-level estimator and metric tests (the sources builders are
another module's): the context is ``"Context: {documents}\\n\\nQuery: {query}"`` in the chat template (ContextCite's
prompt, without the space after the colon: every source text starts with its own space, so a byte-level BPE
tokenises the context as the concatenation of its sources and deleting a source's tokens gives the tokens of the
context without it), each document one source, or each sentence one source inside its document."""

from __future__ import annotations

import torch

from llmattr.prompting import Prompt
from llmattr.sources import Sources
from llmattr.targets import Target

TEMPLATE = "Context:{context}\n\nQuery: {query}"


def token_groups(offsets, ranges) -> tuple[tuple[int, ...], ...]:
    """The tokens whose character range lies inside each of ``ranges``."""
    groups = tuple(tuple(k for k, (a, b) in enumerate(offsets) if b > a and start <= a and b <= end)
                   for start, end in ranges)
    assert all(groups), "a source tokenised to nothing"
    return groups


def context_prompt(tokenizer, documents: list[str], query: str, sentences: list[list[str]] | None = None,
                   gold: tuple[int, ...] = ()) -> Prompt:
    """The prompt of ``documents`` and ``query``; with ``sentences`` (each document's sentences, concatenated into
    the document), the sources are the sentences and ``documents`` their parents. Every text starts with a space."""
    if sentences is not None:
        documents = ["".join(parts) for parts in sentences]
    context = "".join(documents)
    text = tokenizer.apply_chat_template([{"role": "user", "content": TEMPLATE.format(context=context, query=query)}],
                                         tokenize=False, add_generation_prompt=True)
    encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    offsets = [tuple(o) for o in encoded["offset_mapping"]]
    base = text.index(context)
    starts = [base + sum(len(d) for d in documents[:i]) for i in range(len(documents))]
    doc_chars = tuple((s, s + len(d)) for s, d in zip(starts, documents, strict=True))
    docs = Sources(names=tuple(f"document {i + 1}" for i in range(len(documents))),
                   groups=token_groups(offsets, doc_chars), chars=doc_chars, gold=gold)
    sources = docs
    if sentences is not None:
        chars, parents = [], []
        for d, parts in enumerate(sentences):
            at = doc_chars[d][0]
            for part in parts:
                chars.append((at, at + len(part)))
                parents.append(d)
                at += len(part)
        sources = Sources(names=tuple(f"sentence {i + 1}" for i in range(len(chars))),
                          groups=token_groups(offsets, chars), chars=tuple(chars), parents=tuple(parents),
                          documents=docs)
    ids = torch.tensor([encoded["input_ids"]])
    return Prompt(text=text, input_ids=ids, offsets=offsets, span=(0, ids.shape[1]), char_span=(0, len(text)),
                  sources=sources)


def forced(prompt: Prompt, answer_ids: list[int]) -> Target:
    return Target(prompt=prompt, target_ids=torch.tensor(answer_ids), forced=True)
