"""What one explanation asks, checked once: the :class:`Request` that ``llmattr.explain`` and ``llmattr explain``
both build and that :func:`llmattr.api.prepare` and :func:`llmattr.api.explain_text` read.

Every check of a request's values runs when it is built, before any model loads, and raises one
:class:`~llmattr.errors.LlmattrError` line, the same from the Python API and from the CLI (exit 2).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from .checks import SCOPES, TARGET_MODES, check_checkpointing, check_text, member
from .errors import LlmattrError
from .methods import AttributionMethod
from .methods import get as get_method
from .model_free import check_example, check_sources, request_params, task_facts
from .prompting import build_prompt
from .targets import check_length
from .tasks import Task, few_shot, get_task


@dataclass(frozen=True)
class Request:
    """One explanation's question: the task's prompt recipe, the methods (a name or instance, or several) with
    their ``params`` (``objective`` and ``foil`` among them), what is explained (``target``: ``label``, ``generated``,
    ``gold``, with ``gold`` the gold word, else the example's ``label``; or a forced ``answer``; at most
    ``max_new_tokens`` tokens, the task's default if None), what is attributed (``scope``), the few-shot text
    before the content span (``demonstrations``, plus ``shots`` drawn with ``shots_seed`` from ``shots_from`` or
    the task's sample data) and ``checkpointing`` (``auto``, ``on``, ``off``).

    Sources (docs/sources.md): ``documents``, the context every text is asked about (a task that takes
    documents, such as ``context``; each document one source), or ``spans``, the user's ``[start, end)``
    character ranges into the text (each one source); ``sources`` says what one source is, ``document`` (a
    document or span) or ``sentence`` (each sentence of them, split for ``language``). An example's own
    ``documents``/``spans`` (a ``--data`` row's) stand where the request has none.

    A request without methods prepares targets only (:func:`llmattr.api.prepare`: no memory guard); the
    methods are built, and so checked, with the request (``method_objs``, once for every text)."""

    task: Task | str = "sentiment"
    methods: Sequence[str | AttributionMethod] = ()
    params: Mapping[str, object] = field(default_factory=dict)
    target: str = "label"
    gold: str | None = None
    scope: str = "span"
    max_new_tokens: int | None = None
    answer: str | None = None
    demonstrations: str = ""
    shots: int = 0
    shots_seed: int = 0
    shots_from: str | Path | None = None
    checkpointing: str = "auto"
    documents: Sequence[str] | None = None
    spans: Sequence[Sequence[int]] | None = None
    sources: str | None = None
    language: str = "en"
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
        set_field(self, "params", dict(self.params))
        set_field(self, "method_objs", tuple(m if isinstance(m, AttributionMethod)
                                             else get_method(m, **self.params) for m in self.methods))

    @classmethod
    def of(cls, method: str | AttributionMethod | Sequence = "grad-ellm", task: str | Task = "sentiment",
           params: Mapping | None = None, objective: str | None = None, foil: str | int | None = None,
           **options) -> Request:
        """The request of :func:`llmattr.explain`'s keywords: ``method`` one name or instance, or a list of them;
        ``objective`` and ``foil`` join the method parameters ``params`` (refused beside a method instance,
        whose constructor takes them); ``options`` are the other fields."""
        if isinstance(method, AttributionMethod) and (objective, foil) != (None, None):
            raise LlmattrError("objective= and foil= go with a method name; give them to the method instance's "
                               "constructor (objective=, foil=)")
        return cls(task, method, request_params(params, objective, foil), **options)

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
