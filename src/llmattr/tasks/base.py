"""A task: how an example becomes a chat prompt, which part of it is attributed, and what is explained."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..errors import LlmattrError


@dataclass(frozen=True)
class Task:
    """Prompt recipe of one task (paper 000 appendix D, Table 3).

    ``user_template`` is formatted with the example's fields; the content span is the text from the
    first field's value to the end of the last field's value, i.e. the user's own text without the
    template words around it.
    """

    name: str
    user_template: str
    fields: tuple[str, ...]
    system: str | None = None
    kind: str = "generation"  # "classification", "generation" or "regression"
    label_words: tuple[str, ...] = ()
    max_new_tokens: int = 20
    answer_prefix: str = "Answer:"  # used only when the tokenizer has no chat template
    extra: dict = field(default_factory=dict)

    def example_from_text(self, text: str | dict) -> dict:
        """Accept a plain string for the first field, or a dict with every field."""
        example = dict(text) if isinstance(text, dict) else {self.fields[0]: text}
        missing = [name for name in self.fields if not str(example.get(name, "")).strip()]
        if missing:
            raise LlmattrError(
                f"task {self.name} needs non-empty field(s) {', '.join(missing)}"
                + (" (CLI: --field NAME=VALUE)" if len(self.fields) > 1 else "")
            )
        return example

    def user_content(self, example: dict) -> tuple[str, tuple[int, int]]:
        """The user message and the character range of the content span inside it."""
        values = {name: example[name] for name in self.fields}
        content = self.user_template.format(**values)
        head = self.user_template.split("{" + self.fields[0] + "}")[0].format(**values)
        tail = self.user_template.split("{" + self.fields[-1] + "}")[-1].format(**values)
        return content, (len(head), len(content) - len(tail))


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

SENTIMENT = Task(
    name="sentiment", user_template="Text: {text}", fields=("text",), system=SENTIMENT_SYSTEM,
    kind="classification", label_words=("Positive", "Negative"), max_new_tokens=1,
)
BOOLQ = Task(
    name="boolq", user_template="Passage: {passage}\n\nQuestion: {question}", fields=("passage", "question"),
    system=BOOLQ_SYSTEM, kind="classification", label_words=("true", "false"), max_new_tokens=1,
)
GENERATE = Task(name="generate", user_template="{text}", fields=("text",), kind="generation",
                max_new_tokens=10, answer_prefix="")

BUILTIN = {task.name: task for task in (SENTIMENT, BOOLQ, GENERATE)}
