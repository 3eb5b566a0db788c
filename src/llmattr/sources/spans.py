"""Which prompt tokens form each source (a document, a sentence, a user's character span)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Sources:
    """The sources of one prompt, in context order.

    ``groups[i]`` are the absolute positions (into the prompt's input ids, ascending) of source ``i``'s tokens:
    groups are disjoint, non-empty, and never hold a chat-template token. ``chars[i]`` is its ``[start, end)``
    character range in the prompt text. ``gold`` lists the indices of the sources known to hold the answer
    (empty when unknown). ``parents[i]``, on a sentence level, is the index of the source in ``documents`` that
    sentence ``i`` belongs to; on a document level both are ``None``.
    """

    names: tuple[str, ...]
    groups: tuple[tuple[int, ...], ...]
    chars: tuple[tuple[int, int], ...]
    gold: tuple[int, ...] = ()
    parents: tuple[int, ...] | None = None
    documents: Sources | None = None

    def __len__(self) -> int:
        return len(self.groups)
