"""How an explanation's tokens are shown: each token as the characters of the text it covers.

Plain functions of the Explanation's JSON fields (no torch), shared by :class:`llmattr.Explanation` and the
report, which reads stored explanations as JSON.
"""

from __future__ import annotations

from collections.abc import Sequence


def display_tokens(tokens: list[str], offsets: Sequence[Sequence[int]], text: str) -> list[str]:
    """Each prompt token as the characters of the text it covers (by its character offsets).

    Decoding byte-level tokens one by one splits multi-byte characters (Arabic, CJK, emoji) into
    ``\ufffd``; here a character shared by several tokens is shown on the first of them and the others
    show ``""``. Tokens without characters (control tokens) keep their decoded form.
    """
    if len(offsets) != len(tokens) or not text:
        return list(tokens)
    pieces, shown = [], 0
    for token, (s, e) in zip(tokens, offsets, strict=True):
        pieces.append(text[max(s, shown): e] if e > s else token)
        shown = max(shown, e)
    return pieces


def span_display(tokens: list[str], offsets: Sequence[Sequence[int]], text: str, span: Sequence[int],
                 step_tokens: list[str]) -> list[str]:
    """:func:`display_tokens` of the content span (``scope="all"``: then the generated prefix, the tokens of
    every explained step but the last)."""
    return (display_tokens(tokens, offsets, text) + step_tokens[:-1])[span[0]: span[1]]
