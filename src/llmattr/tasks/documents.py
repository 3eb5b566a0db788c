"""Tasks over a context of documents, each document one source (docs/sources.md).

``context``: a question asked of the user's documents (``llmattr explain QUESTION --document ...``), open
generation. ``bio-lookup``: a multi-document task with a known gold source, built from the shipped WikiBio sample
(``data/wikibio.jsonl``): the first sentence of a biography, "NAME (...) is/was a DESCRIPTION.", becomes the
question "Who is/was a DESCRIPTION?" asked over ``k + 1`` documents: that biography (the gold source, with the
name) and ``k`` distractor biographies from other rows; the answer is the name, which only the gold document holds.
"""

from __future__ import annotations

import random
import re

from .base import Task

CONTEXT_SYSTEM = ("You answer questions about the documents the user gives. Answer briefly, using only what the "
                  "documents say.")

CONTEXT = Task(
    name="context", user_template="{documents}\n\nQuestion: {question}", fields=("question",), documents=True,
    system=CONTEXT_SYSTEM, kind="generation", max_new_tokens=20, answer_prefix="Answer:",
    description="a question over the user's documents (each document one source)",
)

# "NAME [(born ...)] is/was a|an|the DESCRIPTION." at the start of a biography
FIRST_SENTENCE = re.compile(r"^(?P<name>[^(]*?)\s*(?:\([^)]*\))?\s+(?P<verb>is|was|are|were)\s+"
                            r"(?P<description>(?:an?|the)\s+[^.]*?)\.(?:\s|$)")
DISTRACTORS = 4  # k: documents beside the gold one
POSITIONS = ("first", "middle", "last")  # where the gold document stands, cycled over the rows


def bio_question(text: str) -> tuple[str, str] | None:
    """``(question, name)`` of a biography's first sentence, or None where it does not read "NAME is a ..."
    (or the name is longer than five words)."""
    found = FIRST_SENTENCE.match(text)
    if found is None or not 0 < len(found["name"].split()) <= 5:
        return None
    verb = "is" if found["verb"] in ("is", "are") else "was"
    return f"Who {verb} {found['description']}?", found["name"].strip()


def gold_index(position: str, k: int) -> int:
    """The gold document's index among ``k + 1`` documents at ``position`` (first, middle, last)."""
    return {"first": 0, "middle": (k + 1) // 2, "last": k}[position]


def with_documents(rows: list[dict], k: int = DISTRACTORS, position: str | None = None,
                   gold: bool = True) -> list[dict]:
    """Each usable biography row as a multi-document example: ``question``, ``documents`` (the biography among
    ``k`` others drawn with the row's own seed), ``gold_sources`` (its index; the position cycles over
    :data:`POSITIONS` by row unless ``position`` is given) and ``label`` (the name). ``gold=False`` puts another
    distractor where the gold document would be (the gold-absent control: ``gold_sources`` empty)."""
    usable = [(row, q) for row in rows if (q := bio_question(row["prompt"])) is not None]
    out = []
    for i, (row, (question, name)) in enumerate(usable):
        rng = random.Random(i)
        others = [other["prompt"] for other, _ in usable if other is not row]
        picked = rng.sample(others, k + 1)
        where = gold_index(position or POSITIONS[i % len(POSITIONS)], k)
        documents = picked[:k]
        documents.insert(where, row["prompt"] if gold else picked[k])
        out.append({"id": row["id"], "question": question, "documents": documents,
                    "gold_sources": [where] if gold else [], "answer": name})
    return out


def names_person(answer: str, name: str) -> bool:
    """Whether a generated ``answer`` names the person: it holds the name's last word (case-insensitive)."""
    return name.split()[-1].strip(",.").lower() in answer.lower()


BIO_LOOKUP = Task(
    name="bio-lookup", user_template=CONTEXT.user_template, fields=("question",), documents=True,
    system=CONTEXT_SYSTEM, kind="generation", max_new_tokens=8, answer_prefix="Answer:", data="wikibio",
    label_field="answer", compose=with_documents, display="Bio lookup", report_order=5,
    description=f"who is the person described? the gold biography among {DISTRACTORS} others from WikiBio "
                "(gold source known)",
)

DOCUMENT_TASKS = {task.name: task for task in (CONTEXT, BIO_LOOKUP)}
