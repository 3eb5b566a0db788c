"""BLiMP minimal pairs as next-word tasks: prefix, target vs foil word, and gold evidence words.

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

from ..errors import LlmattrError

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


def pair_example(row: dict, paradigm: str) -> dict:
    """A BLiMP row (upstream fields) as a next-word example.

    ``text`` is the one-prefix prefix extended by the words the good and bad continuations share
    (``these`` + ``movie theaters``/``movie theater`` -> prefix ``... these movie``), ``target`` and
    ``foil`` are the first words where they differ, ``evidence_words`` the evidence's word indices in
    ``text.split()`` and ``evidence`` the words themselves.
    """
    words = row["one_prefix_prefix"].split()
    good, bad = row["one_prefix_word_good"].split(), row["one_prefix_word_bad"].split()
    shared = 0
    while shared < min(len(good), len(bad)) and good[shared] == bad[shared]:
        shared += 1
    if shared == min(len(good), len(bad)):
        raise LlmattrError(f"BLiMP pair {row.get('pairID')}: good and bad continuations do not differ")
    evidence = evidence_index(paradigm, words)
    return {
        "text": " ".join(words + good[:shared]),
        "target": good[shared],
        "foil": bad[shared],
        "evidence_words": [evidence],
        "evidence": [words[evidence]],
        "sentence_good": row.get("sentence_good"),
        "sentence_bad": row.get("sentence_bad"),
    }
