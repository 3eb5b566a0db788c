"""A task: how an example becomes a chat prompt, which part of it is attributed, and what is explained."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from ..errors import LlmattrError
from ..lazy import torch
from ..models.anatomy import output_head, part
from ..sources.build import check_documents, context_text


@dataclass(frozen=True)
class Kind:
    """What a task kind means to the rest of llmattr: the only place a kind's behaviour is written.

    ``classifies``: the answer is one of the task's label words (its ``classes``): examples must hold one,
    are drawn balanced per class, only the label-word step is evaluated, ``--labels`` and ``finetune
    --objective label`` apply. ``next_word``: the answer is the text's own next word, told apart from the
    example's foil (BLiMP): it is never a label-word target, ``--target gold`` forces the example's word.
    ``numeric``: the gold label is a number (regression); a prompted score shows the nearest label word.
    """

    classifies: bool = False
    next_word: bool = False
    numeric: bool = False


KINDS = {
    "classification": Kind(classifies=True),
    "generation": Kind(),
    "regression": Kind(numeric=True),
    "lm": Kind(next_word=True),
}


SOURCE_KEYS = ("documents", "spans", "gold_sources")  # an example's sources (docs/sources.md)


@dataclass(frozen=True)
class Pairing:
    """Where a row holds a minimal pair (BLiMP's one-prefix method): the prefix column and the columns of the good
    and the bad continuation. The example is the prefix extended by the words both continuations share, its label
    the good continuation's next word and its foil the bad one's (:meth:`Task.pair`)."""

    prefix: str
    good: str
    bad: str


@dataclass(frozen=True)
class Task:
    """Prompt recipe of one task (paper 000 appendix D, Table 3).

    ``user_template`` is formatted with the example's fields; the content span is the text from the
    first field's value to the end of the last field's value, i.e. the user's own text without the
    template words around it.

    Dataset side (docs/tasks.md): ``data`` names the sample file in ``llmattr/data`` (``sst2`` ->
    ``sst2.jsonl``), ``columns`` maps a task field to a file column or a ``{column}`` format string,
    ``hf`` is the Hugging Face ``datasets`` recipe (path, name, split, columns, labels),
    ``select`` keeps only rows whose fields equal the given values (BLiMP paradigms),
    ``label_field`` is the gold column and ``label_map`` maps its values to label words. ``group`` names the
    dataset group ``llmattr evaluate --datasets GROUP`` runs with the other tasks of that group, in registration
    order (BLiMP's five paradigms: ``blimp``). ``pairing`` says where a row holds a minimal pair
    (:class:`Pairing`; BLiMP), ``evidence`` the gold evidence rule of such a task: the prefix's words -> the
    indices of the words that decide the answer (BLiMP's paradigm rules), stored with the example as
    ``evidence_words`` (and the words as ``evidence``), which the alignment metric reads. ``chat=False``
    renders the raw text without the chat template (language-modelling tasks such as BLiMP).
    ``first_token=True`` scores multi-token label words by their first token; otherwise every label
    word must be one token. ``documents=True``: the template's ``{documents}`` slot shows the example's
    ``documents`` (a list of texts, each one source: :func:`llmattr.sources.build.context_text`), and the
    content span starts there (docs/sources.md). ``compose`` turns the sample file's rows into the task's rows
    before they become examples (a multi-document task drawing distractors from other rows; ``documents`` and
    ``gold_sources`` are then kept with each example). ``head`` is the output head the task needs (``"lm"`` for
    a causal LM).

    Report side: ``display`` is the dataset's name in the report's tables and figures (default: ``name``) and
    ``report_order`` its place among the datasets (then by name; paper 000's order for its five).
    """

    name: str
    user_template: str
    fields: tuple[str, ...]
    system: str | None = None
    kind: str = "generation"  # a key of KINDS: classification, generation, regression, lm (next word vs foil)
    label_words: tuple[str, ...] = ()
    max_new_tokens: int = 20
    answer_prefix: str = "Answer:"  # used only when the tokenizer has no chat template
    extra: dict = field(default_factory=dict)
    data: str | None = None
    columns: dict = field(default_factory=dict)
    hf: dict = field(default_factory=dict)
    select: dict = field(default_factory=dict)
    label_field: str | None = None
    label_map: dict = field(default_factory=dict)
    group: str = ""
    pairing: Pairing | None = None
    evidence: Callable[[list[str]], list[int]] | None = None
    chat: bool = True
    first_token: bool = False
    head: str = "lm"
    documents: bool = False
    compose: Callable[[list[dict]], list[dict]] | None = None
    description: str = ""
    display: str = ""
    report_order: float = 100

    def __post_init__(self):
        if self.kind not in KINDS:
            raise LlmattrError(f"task {self.name}: kind must be one of {', '.join(KINDS)}")

    @property
    def classifies(self) -> bool:
        """Whether the answer is one of the task's label words (a classification task)."""
        return KINDS[self.kind].classifies

    @property
    def classes(self) -> tuple[str, ...]:
        """The label words a classification task chooses among (examples are drawn balanced over them); else ()."""
        return self.label_words if self.classifies else ()

    @property
    def next_word(self) -> bool:
        """Whether the answer is the text's own next word, told apart from a foil (a next-word task: BLiMP)."""
        return KINDS[self.kind].next_word

    @property
    def numeric(self) -> bool:
        """Whether the gold label is a number (a regression task)."""
        return KINDS[self.kind].numeric

    @property
    def explains_label_word(self) -> bool:
        """Whether the explained token is, by default, a label word chosen by the LM head (the label-word target)."""
        return bool(self.label_words) and self.head == "lm" and not self.next_word

    @property
    def has_gold_word(self) -> bool:
        """Whether an example's ``label`` names a word ``target="gold"`` can explain (a label word or the next word)."""
        return bool(self.label_words) or self.next_word

    def pair(self, row: dict) -> dict:
        """A row's minimal pair (``pairing``) as example fields: the first field (the prefix extended by the words
        both continuations share), the label column (the good continuation's next word), ``foil`` (the bad one's)
        and, with an ``evidence`` rule, ``evidence_words`` (indices into the prefix's words) and ``evidence``."""
        words = row[self.pairing.prefix].split()
        good, bad = row[self.pairing.good].split(), row[self.pairing.bad].split()
        shared = 0
        while shared < min(len(good), len(bad)) and good[shared] == bad[shared]:
            shared += 1
        if shared == min(len(good), len(bad)):
            raise LlmattrError(f"task {self.name}: pair {row.get('pairID')}: good and bad continuations do not differ")
        fields = {self.fields[0]: " ".join(words + good[:shared]), self.label_field: good[shared], "foil": bad[shared]}
        if self.evidence is None:
            return fields
        evidence = self.evidence(words)
        return {**fields, "evidence_words": evidence, "evidence": [words[i] for i in evidence]}

    def example_from_text(self, text: str | dict) -> dict:
        """Accept a plain string for the first field, or a dict with every field
        (:func:`llmattr.tasks.base.example_fields`)."""
        return example_fields(self.name, self.fields, text)

    @property
    def slots(self) -> tuple[str, ...]:
        """The template's slots in order: ``documents`` (a task that takes them), then the fields."""
        return (("documents",) if self.documents else ()) + self.fields

    def slot_values(self, example: dict) -> dict:
        """Each slot's text: the fields as given, the documents as :func:`~llmattr.sources.build.context_text`
        shows them (a task that takes documents refuses an example without them, in one line)."""
        values = {name: example[name] for name in self.fields}
        if self.documents:
            if example.get("documents") is None:
                raise LlmattrError(f"task {self.name} needs documents (documents=[...]; CLI: --document or "
                                   "--context FILE)")
            values["documents"] = context_text(check_documents(example["documents"]))[0]
        return values

    def inputs(self, example: dict) -> dict:
        """What of a loaded example a prompt is built from: its fields and, where it has them, its sources
        (``documents``, ``spans``, ``gold_sources``: :data:`SOURCE_KEYS`)."""
        return {**{name: example[name] for name in self.fields},
                **{key: example[key] for key in SOURCE_KEYS if example.get(key) is not None}}

    def user_content(self, example: dict) -> tuple[str, tuple[int, int]]:
        """The user message and the character range of the content span inside it: from the first slot's value
        to the end of the last slot's value."""
        values = self.slot_values(example)
        content = self.user_template.format(**values)
        head = self.user_template.split("{" + self.slots[0] + "}")[0].format(**values)
        tail = self.user_template.split("{" + self.slots[-1] + "}")[-1].format(**values)
        return content, (len(head), len(content) - len(tail))

    def uses_chat(self, tokenizer) -> bool:
        """Whether prompts are rendered with the tokenizer's chat template."""
        return self.chat and bool(getattr(tokenizer, "chat_template", None))

    def answer_text(self, word: str, tokenizer) -> str:
        """How an answer word follows the prompt: right after the assistant header, or after a space."""
        return word if self.uses_chat(tokenizer) else " " + word

    def word_ids(self, tokenizer, words: tuple[str, ...] | list[str], first_token: bool | None = None) -> torch.Tensor:
        """Token id scored for each answer word (its only token, or its first with ``first_token``).

        Raises :class:`LlmattrError` when a word is several tokens and the task does not score first
        tokens, or when two words share the scored token (they could not be told apart).
        ``first_token=False`` overrides the task's setting (the label-word target explains the label
        word's own token, never its first piece).
        """
        first_token = self.first_token if first_token is None else first_token
        ids = []
        for word in words:
            pieces = tokenizer(self.answer_text(word, tokenizer), add_special_tokens=False)["input_ids"]
            if not pieces or (len(pieces) > 1 and not first_token):
                raise LlmattrError(
                    f"task {self.name}: label word {word!r} is {len(pieces)} tokens for this tokenizer; "
                    "use single-token label words or a task with first_token=True"
                )
            ids.append(pieces[0])
        if len(set(ids)) < len(ids):
            raise LlmattrError(f"task {self.name}: label words {list(words)} share their first token")
        return torch.tensor(ids)

    def label_ids(self, tokenizer, first_token: bool | None = None) -> torch.Tensor:
        """``(n_labels,)`` token ids of the task's label words, in ``label_words`` order."""
        if not self.label_words:
            raise LlmattrError(f"task {self.name} has no label words (kind {self.kind})")
        return self.word_ids(tokenizer, self.label_words, first_token)

    def head_input_ids(self, tokenizer, example: dict) -> list[int]:
        """What a sequence head reads (``--head``, paper 003): the filled user template, without the system turn
        or chat template, tokenised as the tokenizer does a plain text; the head reads its last token's state."""
        return tokenizer(self.user_content(example)[0])["input_ids"]

    def head_span(self, offsets: list[tuple[int, int]], example: dict) -> tuple[int, int]:
        """The tokens of the head's input (``offsets``: each token's characters in the filled user template) that
        hold the example's text, from the first slot's value to the end of the last's (:meth:`user_content`):
        what paper 003 attributes and deletes; the template's words before and after ("Text:") stay."""
        start, end = self.user_content(example)[1]
        inside = [i for i, (a, b) in enumerate(offsets) if b > a and a < end and b > start]
        if not inside:
            raise LlmattrError(f"the {self.name} input holds no token of the example's text")
        return inside[0], inside[-1] + 1

    def check_model(self, lm) -> None:
        """Refuse a model that lacks the output head this task needs, naming the task to use instead."""
        if self.head == "lm":
            if output_head(lm.model) is None:
                head = (" (it has a sequence head: use the head task, e.g. --task "
                        f"{'stsb-regression' if self.numeric else self.name + '-head'})"
                        if part(lm.model, "score") is not None else "")
                raise LlmattrError(f"task {self.name} needs a language-modelling head; {lm.model_id} lacks one{head}")
            return
        score = part(lm.model, "score")
        if getattr(score, "out_features", None) != self.extra.get("num_labels"):
            raise LlmattrError(
                f"task {self.name} needs a sequence-{self.head} head with {self.extra.get('num_labels')} "
                f"output(s) (paper 003); {lm.model_id} has none: use --task "
                f"{self.extra.get('lm_alternative', 'generate')}, the prompted causal-LM version"
            )

    def gold_label(self, value):
        """A raw dataset label as the task reads it: a label word, a float (regression), or None; refused in one
        line when it is neither (:func:`llmattr.tasks.base.gold_label`)."""
        return gold_label(task_facts(self), value)

    def gold_answer(self, example: dict) -> str:
        """The answer text a few-shot demonstration shows for a loaded example (``example["label"]``)."""
        gold = example.get("label")
        if gold is None:
            raise LlmattrError(f"task {self.name}: example {example.get('id', '?')} has no gold label")
        if self.numeric and self.label_words:  # prompted score: the nearest label word
            return min(self.label_words, key=lambda word: abs(float(word) - gold))
        return str(gold)

    def demonstration(self, example: dict) -> str:
        """One few-shot demonstration: the filled user template and its gold answer."""
        content, _ = self.user_content(example)
        if self.next_word:
            return f"{content} {self.gold_answer(example)}\n"
        return f"{content}\nAnswer: {self.gold_answer(example)}\n\n"


SENTIMENT_SYSTEM = (
    "You are a helpful sentiment classifier. Please help to do the sentiment classification "
    "of the given text and respond ONLY with the single word Positive or Negative."
)
BOOLQ_SYSTEM = (
    "You are a factual question answering system. "
    "Determine if the given passage supports the question being true. "
    "Respond ONLY with the single word \u2019true\u2019 or \u2019false\u2019 in lowercase, "
    "without any punctuation or additional text."
)

def shown(*labelled: tuple[str, str]) -> dict:
    """The ``user_template`` and ``fields`` of a task whose prompt shows each field after its label, a blank line
    between them: ``shown(("Question", "question"), ("Sentence", "sentence"))`` is the template
    ``"Question: {question}\n\nSentence: {sentence}"`` over the fields ``question`` and ``sentence``."""
    return {"user_template": "\n\n".join(f"{label}: {{{name}}}" for label, name in labelled),
            "fields": tuple(name for _, name in labelled)}


SENTIMENT = Task(
    name="sentiment", user_template="Text: {text}", fields=("text",), system=SENTIMENT_SYSTEM,
    kind="classification", label_words=("Positive", "Negative"), max_new_tokens=1,
    label_field="label", label_map={"positive": "Positive", "negative": "Negative"},
    description="sentiment of a text (paper 000 appendix D prompt)",
)
BOOLQ = Task(
    name="boolq", **shown(("Passage", "passage"), ("Question", "question")),
    system=BOOLQ_SYSTEM, kind="classification", label_words=("true", "false"), max_new_tokens=1,
    data="boolq", label_field="label", display="BoolQ", report_order=2,
    hf={"path": "google/boolq", "split": "validation", "label": "answer",
        "labels": {True: "true", False: "false"}},
    description="BoolQ (ERASER) yes/no question over a passage (paper 000 appendix D prompt)",
)
GENERATE = Task(name="generate", user_template="{text}", fields=("text",), kind="generation",
                max_new_tokens=10, answer_prefix="")

BUILTIN = {task.name: task for task in (SENTIMENT, BOOLQ, GENERATE)}


def task_facts(task) -> dict:
    """What the torch-free checks read of a :class:`~llmattr.tasks.Task`: its name, fields, columns (field -> file
    column), label field and whether it takes documents (what reading a file for it needs:
    :func:`llmattr.readers.shaped_rows`), its kind, head, whether it classifies, is a regression, has a gold
    word, is a next-word task or is explained at its label word, its sample data (a name, or None), label words and
    label map (a file's label value -> its label word), the sample rows it selects, whether it composes them (code:
    their number is known once composed) and whether its rows hold minimal pairs (code: the label is the pair's next
    word)."""
    return {"name": task.name, "kind": task.kind, "head": task.head, "fields": list(task.fields),
            "columns": dict(task.columns), "label_field": task.label_field, "documents": task.documents,
            "classifies": task.classifies, "numeric": task.numeric, "has_gold_word": task.has_gold_word,
            "next_word": task.next_word, "explains_label_word": task.explains_label_word,
            "sample_data": task.data, "label_words": list(task.label_words), "label_map": dict(task.label_map),
            "select": dict(task.select), "composed": task.compose is not None, "paired": task.pairing is not None}


def example_fields(task: str, fields: Sequence[str], text: str | Mapping) -> dict:
    """The example of ``text``: a plain string is the first of the task's ``fields``, a dict holds every field
    (:meth:`llmattr.tasks.Task.example_from_text`); an empty or missing field refused in one line."""
    example = dict(text) if isinstance(text, Mapping) else {fields[0]: text}
    missing = [name for name in fields if not str(example.get(name, "")).strip()]
    if missing:
        raise LlmattrError(f"task {task} needs non-empty field(s) {', '.join(missing)}"
                           + (" (CLI: --field NAME=VALUE)" if len(fields) > 1 else ""))
    return example


def label_text(value) -> str | None:
    """A label cell as text: CSV cells are text already; JSON ``1`` -> ``"1"``, ``true`` -> ``"true"``."""
    return value if value is None or isinstance(value, str) else json.dumps(value)


def gold_label(task: Mapping, value: object, row: str | None = None) -> object:
    """A raw dataset label ``value`` as ``task`` (:func:`task_facts`) reads it: a classification task's label word
    (its label map applied), a regression task's number, else the value (None stays None); refused in one line,
    naming ``row`` (an example's id) where given, when a classification task's label is none of its words or a
    regression task's is not a number."""
    of_row = "" if row is None else f" of row {row}"
    if task["numeric"]:
        if value is None:
            return None
        try:
            return float(value)
        except (TypeError, ValueError):
            raise LlmattrError(f"task {task['name']}: label {value!r}{of_row} is not a number; fix the file or map "
                               "the label column") from None
    label = None if value is None else task["label_map"].get(value, value)
    if task["classifies"] and label not in task["label_words"]:
        raise LlmattrError(f"task {task['name']}: label {value!r}{of_row} is not one of "
                           f"{list(task['label_map']) or list(task['label_words'])}; fix the file or map the label "
                           "column")
    return label
