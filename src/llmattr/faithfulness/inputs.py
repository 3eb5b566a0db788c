"""What the metrics read from an Explanation: its model input, the steps to score and the seed key."""

from __future__ import annotations

import hashlib
import json

from ..checks import member
from ..errors import LlmattrError
from ..explanation import Explanation
from ..lazy import torch
from ..models.loading import LoadedModel
from ..prompting import Prompt
from ..targets import SCOPES, Target
from ..tasks import TASKS


def target_from_explanation(expl: Explanation) -> Target:
    """The :class:`Target` an Explanation was computed on (prompt ids, content span, sources, explained tokens)."""
    a, b = expl.span
    if not expl.token_ids or not 0 <= a < b <= len(expl.token_ids) + len(expl.steps) - 1 or not expl.steps:
        raise LlmattrError("the explanation has no prompt tokens, an empty content span or no steps")
    offsets = [tuple(o) for o in expl.offsets]
    n = len(expl.token_ids)
    char_span = (offsets[a][0], offsets[min(b, n) - 1][1]) if len(offsets) == n else (0, 0)
    prompt = Prompt(text=expl.text, input_ids=torch.tensor([expl.token_ids]), offsets=offsets,
                    span=(a, b), char_span=char_span, sources=expl.sources)
    return Target(prompt=prompt, target_ids=torch.tensor([s.token_id for s in expl.steps]), forced=expl.forced,
                  scope=expl.scope)


def check_explanation(explanation: object) -> Explanation:
    """``explanation`` if it is an Explanation, else one line naming what was given (the metrics' first check)."""
    if not isinstance(explanation, Explanation):
        raise LlmattrError(f"evaluate() takes an Explanation (llmattr.explain's result), got "
                           f"{type(explanation).__name__}")
    return explanation


def check_scope(expl: Explanation, scope: str | None, mode: str = "paper") -> None:
    """Refuse metrics under a scope the explanation does not attribute (``prompt`` and ``all`` are the same
    tokens for a one-step explanation)."""
    wanted = scope or ("all" if mode == "reagent" else expl.scope)
    member(wanted, SCOPES, "scope")
    if wanted != expl.scope and not (len(expl.steps) == 1 and {wanted, expl.scope} == {"prompt", "all"}):
        why = " (mode='reagent' perturbs what the ReAGent evaluator code does)" if scope is None else ""
        raise LlmattrError(f"the metrics perturb what was attributed: the explanation has scope "
                           f"{expl.scope!r}, scope {wanted!r} was asked{why}; explain with scope={wanted!r} "
                           f"or pass scope={expl.scope!r}")


def evaluated_steps(expl: Explanation, step_stride: int) -> list[int]:
    """Classification: the label-word step (the first); generation: every ``step_stride``-th step."""
    if step_stride < 1:
        raise LlmattrError("step_stride must be at least 1")
    task = TASKS.get(expl.task) if expl.task else None
    if task is not None and task.classifies:
        return [0]
    return list(range(0, len(expl.steps), step_stride))


def check_tokenizer(expl: Explanation, lm: LoadedModel) -> None:
    """Refuse to evaluate an explanation with a model whose tokenizer reads its token ids differently
    (another model's explanation would be scored on nonsense tokens)."""
    vocab = lm.model.get_input_embeddings().num_embeddings
    ids = expl.token_ids + [s.token_id for s in expl.steps]
    if max(ids) >= vocab or [lm.tokenizer.decode([i]) for i in expl.token_ids] != expl.tokens:
        raise LlmattrError(f"the explanation's tokens are not {lm.model_id}'s: evaluate it with the model it "
                           f"explains ({expl.model})")


def example_key(expl: Explanation) -> str:
    """What identifies the example for seeding: the prompt ids, the span and the explained tokens."""
    data = [expl.token_ids, list(expl.span), [s.token_id for s in expl.steps]]
    return hashlib.sha256(json.dumps(data).encode()).hexdigest()
