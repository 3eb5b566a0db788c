"""Which prompt tokens form each source (a document, a sentence, a user's character span)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

GRANULARITIES = ("document", "sentence")  # what one source is: a document (or a user's span), or a sentence


@dataclass(frozen=True)
class Sources:
    """The sources of one prompt, in context order.

    ``groups[i]`` are the absolute positions (into the prompt's input ids, ascending) of source ``i``'s tokens:
    groups are disjoint, non-empty, and never hold a chat-template token. ``chars[i]`` is its ``[start, end)``
    character range in the prompt text. ``gold`` lists the indices of the sources known to hold the answer
    (empty when unknown). ``parents[i]``, on a sentence level, is the index of the source in ``documents`` that
    sentence ``i`` belongs to; on a document level both are ``None``.

    On an :class:`~llmattr.explanation.Explanation` the same object is kept (absolute positions); the score
    columns of source ``i`` are ``groups[i]`` minus ``span[0]`` (:meth:`columns`).
    """

    names: tuple[str, ...]
    groups: tuple[tuple[int, ...], ...]
    chars: tuple[tuple[int, int], ...]
    gold: tuple[int, ...] = ()
    parents: tuple[int, ...] | None = None
    documents: Sources | None = None

    def __len__(self) -> int:
        return len(self.groups)

    def columns(self, span: tuple[int, int]) -> list[np.ndarray]:
        """Each source's token indices into ``span`` (the score columns of an Explanation whose span it is)."""
        return [np.asarray(group, dtype=np.int64) - span[0] for group in self.groups]

    def owners(self, span: tuple[int, int]) -> np.ndarray:
        """``(b - a,)``: the source of each token of ``span``, -1 for a token of no source (the question, the
        template words between documents): the feature of each token for a method that perturbs whole sources."""
        owner = np.full(span[1] - span[0], -1, dtype=np.int64)
        for i, cols in enumerate(self.columns(span)):
            owner[cols] = i
        return owner

    def texts(self, text: str) -> list[str]:
        """Each source's characters of the prompt ``text``."""
        return [text[s:e] for s, e in self.chars]

    def to_dict(self) -> dict:
        """JSON-ready: lists for tuples, ``documents`` nested."""
        return {"names": list(self.names), "groups": [list(g) for g in self.groups],
                "chars": [list(c) for c in self.chars], "gold": list(self.gold),
                "parents": None if self.parents is None else list(self.parents),
                "documents": None if self.documents is None else self.documents.to_dict()}

    @classmethod
    def from_dict(cls, data: dict) -> Sources:
        """The inverse of :meth:`to_dict`."""
        parents, documents = data.get("parents"), data.get("documents")
        return cls(names=tuple(data["names"]), groups=tuple(tuple(int(p) for p in g) for g in data["groups"]),
                   chars=tuple((int(s), int(e)) for s, e in data["chars"]), gold=tuple(data.get("gold", ())),
                   parents=None if parents is None else tuple(parents),
                   documents=None if documents is None else cls.from_dict(documents))
