"""BLiMP minimal pairs as next-word tasks: prefix, target vs foil word, and gold evidence words. Every BLiMP fact
is here: the five tasks (:data:`BLIMP`, registered by :mod:`.catalog`), their group ``blimp``, the pair's columns
(:data:`PAIRING`) and the evidence rules; the loaders, ``evaluate`` and the alignment metric read them from the task.

Paper 003 (sec. 5.1, Table 3) uses five agreement paradigms of BLiMP and locates the *evidence* (the
word that decides the correct form) with spaCy: the coreferent of the anaphor (ana), the determiner of
the target noun (dna, dnaa), the subject of the verb (darn, rpsv). spaCy's English models are not on
PyPI (only unofficial re-uploads), so llmattr derives the evidence from the fixed templates BLiMP
generates each paradigm with (docs/tasks.md gives the rules and their hand-checked accuracy):

- ``ana``  (``The Borgias investigated`` -> themselves/herself): the subject's head noun, i.e. the first
  word after the leading determiners/quantifiers (``The``, ``Most``, ``A lot of`` ...);
- ``dna``, ``dnaa`` (``Russell explored this`` -> mall/malls, ``Patients scan this orange`` ->
  brochure/brochures): the determiner, the last demonstrative (this/that/these/those) of the prefix;
- ``darn`` (``The sister of doctors`` -> writes/write): the head noun, the word before the first
  ``of``/``about`` (the relational noun's complement is the distractor);
- ``rpsv`` (``The pedestrian`` -> has/have): the subject's head noun, the last word of the prefix.
"""

from __future__ import annotations

from functools import partial

from ..errors import LlmattrError
from .base import Pairing, Task

PARADIGMS = {
    "ana": "anaphor_number_agreement",
    "dna": "determiner_noun_agreement_1",
    "dnaa": "determiner_noun_agreement_with_adjective_1",
    "darn": "distractor_agreement_relational_noun",
    "rpsv": "regular_plural_subject_verb_agreement_1",
}
DETERMINERS = {"the", "a", "an", "this", "that", "these", "those", "some", "many", "most", "all", "every",
               "each", "few", "several", "no", "both"}
DEMONSTRATIVES = {"this", "that", "these", "those"}
RELATIONAL = ("of", "about")


def subject_head(words: list[str]) -> int:
    """Index of the subject's head noun: the first word after leading determiners or ``a lot of``."""
    i = 0
    while i < len(words):
        if [w.lower() for w in words[i: i + 3]] == ["a", "lot", "of"]:
            i += 3
        elif words[i].lower() in DETERMINERS:
            i += 1
        else:
            return i
    raise LlmattrError(f"no subject noun in {' '.join(words)!r}")


def evidence_index(paradigm: str, words: list[str]) -> int:
    """Index (in ``words``, the upstream prefix split on spaces) of the evidence word of ``paradigm``."""
    if paradigm == "ana":
        return subject_head(words)
    if paradigm in ("dna", "dnaa"):
        hits = [i for i, w in enumerate(words) if w.lower() in DEMONSTRATIVES]
        if not hits:
            raise LlmattrError(f"{paradigm}: no demonstrative determiner in {' '.join(words)!r}")
        return hits[-1]
    if paradigm == "darn":
        lowered = [w.lower() for w in words]
        hits = [i for i, w in enumerate(lowered) if w in RELATIONAL and i > 0]
        if not hits:
            raise LlmattrError(f"darn: no relational 'of'/'about' in {' '.join(words)!r}")
        return hits[0] - 1
    if paradigm == "rpsv":
        return len(words) - 1
    raise LlmattrError(f"unknown BLiMP paradigm {paradigm!r}; valid: {', '.join(PARADIGMS)}")


def evidence_words(paradigm: str, words: list[str]) -> list[int]:
    """The gold evidence of ``paradigm`` in ``words`` (the prefix split on spaces): one word index
    (:func:`evidence_index`); a BLiMP task's ``evidence`` rule."""
    return [evidence_index(paradigm, words)]


PAIRING = Pairing(prefix="one_prefix_prefix", good="one_prefix_word_good", bad="one_prefix_word_bad")


def blimp_task(short: str) -> Task:
    """``blimp-<short>``: the BLiMP paradigm as next-word prediction, target vs foil word (its minimal pair), with
    the paradigm's gold evidence; one dataset of the group ``blimp``."""
    return Task(
        name=f"blimp-{short}", user_template="{text}", fields=("text",), kind="lm", max_new_tokens=1,
        answer_prefix="", chat=False, data="blimp", select={"paradigm_short": short}, label_field="target",
        hf={"path": "nyu-mll/blimp", "name": PARADIGMS[short], "split": "train"},
        group="blimp", pairing=PAIRING, evidence=partial(evidence_words, short),
        description=f"BLiMP {PARADIGMS[short]} (paper 003 Table 3): next word, target vs foil, gold evidence",
    )


BLIMP = {f"blimp-{short}": blimp_task(short) for short in PARADIGMS}  # paper 003 Table 3's five paradigms
