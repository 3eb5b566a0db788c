"""How an explanation's tokens are shown: each token as the characters of the text it covers.

Plain functions of the Explanation's JSON fields (no torch), shared by :class:`llmattr.Explanation` and the
report, which reads stored explanations as JSON.
"""

from __future__ import annotations

import unicodedata
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


ZWJ = "\u200d"  # zero-width joiner: a letter beside it takes its joined form
# Arabic letters that join only the letter before them (right-joining), or none (hamza): the word's next letter
# starts a new shape after them
ARABIC_RIGHT_JOINING = set("\u0621\u0622\u0623\u0624\u0625\u0627\u0629\u062f\u0630\u0631\u0632\u0648\u0671"
                           "\u0672\u0673\u0675\u0676\u0677\u0688\u0689\u068a\u068b\u068c\u068d\u068e\u068f"
                           "\u0690\u0691\u0692\u0693\u0694\u0695\u0696\u0697\u0698\u0699\u06c0\u06c3\u06c4"
                           "\u06c5\u06c6\u06c7\u06c8\u06c9\u06ca\u06cb\u06cd\u06cf\u06d2\u06d3\u06d5\u06ee\u06ef")


def _base(piece: str, last: bool) -> str:
    """The last (or first) character of ``piece`` that is not a combining mark (Arabic vowel signs), or ""."""
    for ch in reversed(piece) if last else piece:
        if not unicodedata.combining(ch):
            return ch
    return ""


def _arabic_letter(ch: str) -> bool:
    return "\u0620" <= ch <= "\u06ff" and unicodedata.category(ch) == "Lo" or ch == "\u0640"  # letters, tatweel


def joins(before: str, after: str) -> bool:
    """Whether an Arabic letter ending ``before`` joins the one starting ``after`` in the written word."""
    a, b = _base(before, last=True), _base(after, last=False)
    return (_arabic_letter(a) and a not in ARABIC_RIGHT_JOINING and _arabic_letter(b)
            and b != "\u0621")


def joined_cells(pieces: list[str]) -> list[str]:
    """``pieces`` for cells of their own (the side-by-side grid's columns): where an Arabic word goes on across a
    cell boundary, a zero-width joiner on both sides of it, so each letter keeps its joined form instead of the
    isolated one."""
    cells = list(pieces)
    for i in range(len(cells) - 1):
        if joins(pieces[i], pieces[i + 1]):
            cells[i] += ZWJ
            cells[i + 1] = ZWJ + cells[i + 1]
    return cells


def continues_word(piece: str, following: str) -> bool:
    """Whether ``following`` goes on with ``piece``'s word (a sub-word token: letters or digits on both sides of
    the boundary, in a script that separates words by spaces; a CJK character is a word of its own)."""
    a, b = _base(piece, last=True), following[:1]
    if b and unicodedata.combining(b):  # a vowel sign or accent of the letter before
        return True
    return (a.isalnum() and b.isalnum()
            and unicodedata.east_asian_width(a) not in "WF" and unicodedata.east_asian_width(b) not in "WF")
