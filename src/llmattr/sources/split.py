"""Sentences of a text by character ranges: Wikimedia's ``sentencex`` (docs/sources.md says why this splitter).

``sentencex`` is rule-based (no model, no download), MIT-licensed, has no dependencies, is maintained by
Wikimedia and covers about 300 languages (each with its abbreviation list, falling back along a language chain),
and it returns each sentence's character offsets, so no sentence has to be found again in the text.
"""

from __future__ import annotations

from sentencex import get_sentence_boundaries


def sentences(text: str, language: str = "en") -> list[tuple[int, int]]:
    """``[start, end)`` character ranges of the sentences of ``text``, in order, contiguous (the space after a
    sentence belongs to it), whitespace-only pieces left out; one range for a text without a boundary."""
    bounds = get_sentence_boundaries(language, text)  # a language it lacks falls back to its chain's, then English
    ranges = [(b["start_index"], b["end_index"]) for b in bounds if text[b["start_index"]: b["end_index"]].strip()]
    return ranges or [(0, len(text))]
