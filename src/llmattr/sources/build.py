"""Sources from the input: a context of documents, the sentences inside them, or the user's character spans.

The documents are shown in the user turn as ``Document [i]: <text>`` paragraphs (:func:`context_text`); a source
is the document's own text, never its label, the blank lines between documents, the question, the answer or a
chat-template token. Tokens are assigned to sources by their character offsets (:func:`token_groups`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..errors import LlmattrError, article
from .spans import GRANULARITIES, Sources
from .split import sentences

DOCUMENT_LABEL = "Document [{}]: "
DOCUMENT_SEPARATOR = "\n\n"


def check_documents(documents: object) -> tuple[str, ...]:
    """``documents`` as a tuple of texts, refused in one line when it is not a non-empty list of non-empty
    strings (naming the first bad document by its number, from 1)."""
    if isinstance(documents, str) or not isinstance(documents, Sequence):
        raise LlmattrError(f"documents must be a list of texts, got {type(documents).__name__}")
    if not documents:
        raise LlmattrError("no documents: give at least one document")
    for i, doc in enumerate(documents, 1):
        if not isinstance(doc, str):
            raise LlmattrError(f"document {i} is {article(type(doc).__name__)}, not a text")
        if not doc.strip():
            raise LlmattrError(f"document {i} is empty: every document must hold some text")
    return tuple(documents)


def check_spans(spans: object, length: int | None = None) -> tuple[tuple[int, int], ...]:
    """The user's ``[start, end)`` character spans, sorted, refused in one line when one is not two integers with
    ``0 <= start < end`` (``<= length`` when given), or two overlap."""
    if isinstance(spans, str) or not isinstance(spans, Sequence) or not spans:
        raise LlmattrError("spans must be a non-empty list of [start, end) character ranges")
    out = []
    for i, pair in enumerate(spans, 1):
        if (not isinstance(pair, Sequence) or len(pair) != 2
                or not all(isinstance(v, int) and not isinstance(v, bool) for v in pair)):
            raise LlmattrError(f"span {i} must be two integers [start, end), got {pair!r}")
        start, end = pair
        if not 0 <= start < end or (length is not None and end > length):
            raise LlmattrError(f"span {i} [{start}, {end}) is empty or outside the text"
                               + (f" of {length} characters" if length is not None else ""))
        out.append((start, end))
    out.sort()
    for (s0, e0), (s1, e1) in zip(out, out[1:], strict=False):
        if s1 < e0:
            raise LlmattrError(f"spans [{s0}, {e0}) and [{s1}, {e1}) overlap; sources must be disjoint")
    return tuple(out)


def context_text(documents: Sequence[str]) -> tuple[str, list[tuple[int, int]]]:
    """The context shown to the model, ``Document [1]: ...\\n\\nDocument [2]: ...``, and each document's
    ``[start, end)`` character range in it (its own text, without the label)."""
    parts, ranges, at = [], [], 0
    for i, doc in enumerate(documents, 1):
        label = DOCUMENT_LABEL.format(i) if i == 1 else DOCUMENT_SEPARATOR + DOCUMENT_LABEL.format(i)
        parts += [label, doc]
        ranges.append((at + len(label), at + len(label) + len(doc)))
        at += len(label) + len(doc)
    return "".join(parts), ranges


def token_groups(offsets: Sequence[Sequence[int]], span: tuple[int, int],
                 ranges: Sequence[tuple[int, int]]) -> list[tuple[int, ...]]:
    """The absolute positions of the tokens of ``span`` that fall in each of the sorted, disjoint character
    ``ranges``.

    A token belongs to the range that holds the larger part of its characters; where a token straddles two
    ranges (a sentence boundary inside a token) the one holding more of it wins, the earlier on a tie. A token
    with no character in any range (template words, separators, a control token without characters) belongs
    to none. Vectorised: two binary searches per token, no loop over tokens.
    """
    a, b = span
    if not ranges or b <= a:
        return [() for _ in ranges]
    starts, ends = (np.array(col, dtype=np.int64) for col in zip(*ranges, strict=True))
    off = np.asarray(offsets[a:b], dtype=np.int64).reshape(-1, 2)
    ts, te = off[:, 0], off[:, 1]
    lo = np.searchsorted(ends, ts, side="right")  # the first range ending after the token starts
    hi = np.searchsorted(starts, te, side="left") - 1  # the last range starting before the token ends
    k = len(ranges)
    first, last = lo.clip(0, k - 1), hi.clip(0, k - 1)

    def overlap(i: np.ndarray) -> np.ndarray:
        return np.minimum(ends[i], te) - np.maximum(starts[i], ts)

    in_first, in_last = overlap(first), overlap(last)
    owner = np.where(in_last > in_first, last, first)
    owner[(te <= ts) | (lo > hi) | (np.maximum(in_first, in_last) <= 0)] = -1
    positions = np.arange(a, b)
    return [tuple(positions[owner == i].tolist()) for i in range(k)]


def _sources(names: list[str], ranges: list[tuple[int, int]], offsets, span, gold=(), parents=None,
             documents: Sources | None = None) -> Sources:
    """Sources of the absolute character ``ranges``; a source that holds no token is refused in one line."""
    groups = token_groups(offsets, span, ranges)
    empty = [name for name, group in zip(names, groups, strict=True) if not group]
    if empty:
        raise LlmattrError(f"source {empty[0]} tokenises to nothing (its characters are inside a token of "
                           "another source or of the template); give longer or differently placed sources")
    return Sources(tuple(names), tuple(groups), tuple(ranges), tuple(gold), parents, documents)


def build_sources(ranges: Sequence[tuple[int, int]], text: str, offsets, span: tuple[int, int],
                  granularity: str = "document", gold: Sequence[int] = (), language: str = "en",
                  names: Sequence[str] | None = None) -> Sources:
    """The prompt's :class:`Sources` from the absolute character ``ranges`` of its documents (or the user's
    spans) in the prompt ``text``: one source per range (``granularity="document"``), or one per sentence of
    each (``"sentence"``, :func:`llmattr.sources.split.sentences`; ``parents`` and ``documents`` then say which
    document each sentence is in, and a sentence of a gold document is gold)."""
    if granularity not in GRANULARITIES:
        raise LlmattrError(f"sources must be one of {', '.join(GRANULARITIES)}, got {granularity!r}")
    names = list(names) if names is not None else [f"document {i}" for i in range(1, len(ranges) + 1)]
    docs = _sources(names, list(ranges), offsets, span, gold)
    if granularity == "document":
        return docs
    sent_names, sent_ranges, parents = [], [], []
    for d, (start, end) in enumerate(ranges):
        for j, (s, e) in enumerate(sentences(text[start:end], language), 1):
            sent_names.append(f"{names[d]}, sentence {j}")
            sent_ranges.append((start + s, start + e))
            parents.append(d)
    gold_sentences = [i for i, d in enumerate(parents) if d in set(gold)]
    return _sources(sent_names, sent_ranges, offsets, span, gold_sentences, tuple(parents), docs)
