"""What one explanation asks, checked once: the :class:`Request` that ``llmattr.explain`` and ``llmattr explain``
both build and that :func:`llmattr.api.prepare` and :func:`llmattr.api.explain_text` read.

Every check of a request's values runs when it is built, before any model loads, and raises one
:class:`~llmattr.errors.LlmattrError` line, the same from the Python API and from the CLI (exit 2).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path

from .checks import SCOPES, TARGET_MODES, check_checkpointing, check_text, member
from .declarations import asked
from .errors import LlmattrError
from .methods import AttributionMethod
from .methods import get as get_method
from .prompting import build_prompt
from .sources.build import check_documents, check_spans
from .sources.spans import GRANULARITIES
from .targets import check_gold_word, check_length
from .tasks import Task, few_shot, get_task
from .tasks.base import task_facts


@dataclass(frozen=True)
class Request:
    """One explanation's question, checked once when built (:meth:`__post_init__`): each field's meaning is its
    ``help`` (:data:`FIELDS`, :func:`field_docs`).

    An example's own ``documents``/``spans`` (a ``--data`` row's) stand where the request has none. A request
    without methods prepares targets only (:func:`llmattr.api.prepare`: no memory guard); the methods are built,
    and so checked, with the request (``method_objs``, once for every text)."""

    task: Task | str = asked("sentiment", "The prompt recipe (a task name or Task; llmattr.explain's default: "
                                          "sentiment, or context with documents).")
    methods: Sequence[str | AttributionMethod] = asked((), "A method name or instance, or several: explained side "
                                                           "by side on one generation.")
    params: Mapping[str, object] = asked(help="The methods' parameters ({name: value}).", default_factory=dict)
    target: str = asked("label", "Tasks with label words: explain the predicted label word (label), the free greedy "
                                 "answer (generated) or the gold label word (gold; give it as --field label=WORD).",
                        str)
    gold: str | None = asked(None, "target='gold': the gold word (default: the example's label).")
    scope: str = asked("span", "What is attributed, and perturbed/zeroed by --evaluate: span (the content), prompt "
                               "(every prompt token, template included: paper 000's pipeline) or all (prompt + "
                               "generated prefix).", str)
    max_new_tokens: int | None = asked(None, "Tokens to generate and explain (task default if unset).", int)
    answer: str | None = asked(None, "Force this answer text instead of greedy generation.", str)
    demonstrations: str = asked("", "A few-shot text before the content span (neither attributed nor perturbed).")
    shots: int = asked(0, "Few-shot demonstrations (from the task sample data) before the text.", int)
    shots_seed: int = asked(0, "The seed the shots are drawn with (never the text itself).")
    shots_from: str | Path | None = asked(None, "--shots: draw the demonstrations from this JSONL/CSV/TSV file (the "
                                                "task's fields and label) instead of the sample data.", Path)
    checkpointing: str = asked("auto", "Recompute blocks in the backward pass to save memory: auto (only when "
                                       "needed), on, off.", str)
    documents: Sequence[str] | None = asked(None, "The documents the text (the question) is asked about, each one "
                                                  "source (docs/sources.md).")
    spans: Sequence[Sequence[int]] | None = asked(None, "Sources as [start, end) character ranges into the text.")
    sources: str | None = asked(None, "What one source is: document (each document or --span) or sentence (each "
                                      "sentence of them, or of TEXT).", str)
    language: str = asked("en", "The language sentences are split for (sources='sentence').")
    objective: str | None = asked(None, "What the method explains: probability, log-prob, logit, contrast "
                                        "(logit(target) - logit(foil)) or contrast-prob (default: the method's own; "
                                        "see docs/methods-gradient.md).", str, compare=False)  # params hold it
    foil: str | int | None = asked(None, "--objective contrast/contrast-prob: the alternative answer, one token as "
                                         "written (e.g. Negative: 'why Positive rather than Negative').", str,
                                   compare=False)
    method_objs: tuple[AttributionMethod, ...] = field(init=False, repr=False, compare=False)
    examples: dict = field(default_factory=dict, init=False, repr=False, compare=False)  # each text's, made once

    def __post_init__(self) -> None:
        """The one check: task, target, scope, checkpointing and every method with its parameters."""
        set_field = object.__setattr__  # frozen: the checked, normalised values are set once, here
        set_field(self, "task", get_task(self.task))
        member(self.target, TARGET_MODES, "target")
        member(self.scope, SCOPES, "scope")
        check_checkpointing(self.checkpointing)
        self.check_sources()
        one = isinstance(self.methods, str | AttributionMethod)
        set_field(self, "methods", (self.methods,) if one else tuple(self.methods))
        if (self.objective, self.foil) != (None, None) and any(isinstance(m, AttributionMethod) for m in self.methods):
            raise LlmattrError("objective= and foil= go with a method name; give them to the method instance's "
                               "constructor (objective=, foil=)")
        set_field(self, "params", request_params(self.params, self.objective, self.foil))
        set_field(self, "method_objs", tuple(m if isinstance(m, AttributionMethod)
                                             else get_method(m, **self.params) for m in self.methods))

    @classmethod
    def of(cls, method: str | AttributionMethod | Sequence = "grad-ellm", task: str | Task = "sentiment",
           params: Mapping | None = None, **fields) -> Request:
        """The request of :func:`llmattr.explain`'s keywords: ``method`` one name or instance, or a list of them,
        with the method parameters ``params``; ``fields`` are the other fields."""
        return cls(task, method, params or {}, **fields)

    def check_sources(self) -> None:
        """The sources asked for, refused in one line: documents that are not a non-empty list of non-empty
        texts, documents beside spans or for a task that takes none, spans that are not disjoint ranges."""
        documents, spans = check_sources(self.task.name, self.task.documents, self.sources, self.documents,
                                         self.spans)
        object.__setattr__(self, "documents", documents)
        object.__setattr__(self, "spans", spans)

    def example(self, text: str | dict) -> dict:
        """The example of ``text`` (:meth:`Task.example_from_text`) with the request's documents or spans: made once
        per text, whether the CLI checks it, the request checks it or an explanation reads it."""
        key = json.dumps(text, sort_keys=True, default=str)
        if key not in self.examples:
            example = self.task.example_from_text(text)
            extra = {"documents": self.documents, "spans": self.spans}
            self.examples[key] = {**example, **{name: value for name, value in extra.items() if value is not None}}
        return self.examples[key]

    @property
    def has_sources(self) -> bool:
        """Whether the prompts of this request hold sources (documents, spans or sentences)."""
        return bool(self.task.documents) or self.spans is not None or self.sources is not None

    def check_prompt(self, tokenizer, max_length: int, text: str | dict) -> None:
        """Refuse, with the model's tokenizer and context length only (before its weights load), a prompt of
        ``text`` with a source that tokenises to nothing, or longer than the model's context with the answer's
        tokens (:func:`llmattr.targets.check_length`)."""
        example = self.example(text)
        prompt = build_prompt(tokenizer, self.task, example, self.few_shot_text(example), self.sources,
                              self.language)
        n_new = self.task.max_new_tokens if self.max_new_tokens is None else self.max_new_tokens
        check_length(prompt.length, n_new, max_length)

    def gold_of(self, example: dict) -> str | None:
        """The gold word of ``example``: the request's ``gold``, else the example's ``label``."""
        return example.get("label") if self.gold is None else self.gold

    def few_shot_text(self, example: dict) -> str:
        """The text before the content span: ``demonstrations``, then ``shots`` drawn demonstrations (never
        ``example`` itself)."""
        if not self.shots:
            return self.demonstrations
        return self.demonstrations + few_shot(self.task, self.shots, self.shots_seed,
                                              exclude=[{"id": None, **example}], source=self.shots_from)

    def check_text(self, text: object) -> None:
        """Refuse, before any work, what is not a text of this request: not a str or a dict of the task's
        fields, empty, an empty field, without sources for a method that scores sources, or (``target="gold"``
        on a next-word task) without its gold word."""
        check_text(text)
        example = self.example(text)
        scoring = [m.name for m in self.method_objs if m.granularity == "source"]
        check_example(task_facts(self.task), example, scoring, self.sources,
                      self.gold_of(example) if self.target == "gold" and self.answer is None else False)


FIELDS = {f.name: f for f in fields(Request) if "help" in f.metadata}  # what a user asks, each written once
KEYWORDS = tuple(name for name in FIELDS if name not in ("task", "methods", "params"))  # llmattr.explain's


def field_docs() -> str:
    """Each field of :data:`KEYWORDS` as a line of a docstring: its name, default and help."""
    return "\n".join(f"    ``{name}`` (default ``{FIELDS[name].default!r}``): {FIELDS[name].metadata['help']}"
                     for name in KEYWORDS)


def request_params(params: Mapping | None, objective: object, foil: object) -> dict:
    """The method parameters of a request: ``params`` with ``objective`` and ``foil`` (``llmattr.explain``'s
    keywords, ``explain --objective/--foil``) where given."""
    return {**(params or {}), **{key: value for key, value in (("objective", objective), ("foil", foil))
                                 if value is not None}}


def task_asked(task: object, documents: object) -> object:
    """The task a request names, or the default one: ``context`` where documents are given (``documents=``,
    ``--document``, ``--context``), else ``sentiment``."""
    return task if task is not None else "context" if documents is not None else "sentiment"


def check_sources(task: str, takes_documents: bool, sources: str | None, documents: object,
                  spans: object) -> tuple[tuple[str, ...] | None, tuple[tuple[int, int], ...] | None]:
    """The sources a request asks for (``documents``, ``spans``: None when not given) checked: ``sources`` one of
    the granularities, documents a non-empty list of non-empty texts for a task that ``takes_documents`` and not
    beside spans, spans disjoint ranges; returns them as tuples."""
    if sources is not None:
        member(sources, GRANULARITIES, "sources")
    if documents is not None:
        if not takes_documents:
            raise LlmattrError(f"task {task} takes no documents; use --task context (or a task that shows documents)")
        if spans is not None:
            raise LlmattrError("give documents or spans, not both")
        documents = check_documents(documents)
    return documents, None if spans is None else check_spans(spans)


def check_example(task: Mapping, example: Mapping, scoring: Sequence[str], sources: str | None,
                  gold: str | None) -> None:
    """Refuse what :meth:`llmattr.request.Request.check_text` refuses of one ``example`` of ``task``
    (:func:`task_facts`): documents that are not a non-empty list of texts (a task that takes them), spans outside
    its text, a prompt without sources for a method that scores them (``scoring``: their names) and, where the gold
    word is explained (``gold`` not False: the word, or None), a next-word task without it."""
    if task["documents"]:
        check_documents(example.get("documents") if example.get("documents") is not None else ())
    if example.get("spans") is not None:
        check_spans(example["spans"], len(str(example[task["fields"][0]])))
    if scoring and not (task["documents"] or example.get("spans") is not None or sources == "sentence"):
        raise LlmattrError(f"method {scoring[0]} scores sources and needs sources: give documents "
                           "(--document, --context; documents=[...]), spans (--span) or --sources sentence")
    if gold is not False and task["next_word"]:
        check_gold_word(task["name"], gold)
