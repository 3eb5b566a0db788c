"""Faithfulness metrics: pi-Soft-NC/NS and Soft-NC/NS (paper 000), on any Explanation.

``llmattr.evaluate(explanation)`` scores an Explanation's retain probabilities with the soft metrics;
:func:`target_from_explanation` rebuilds the model input from the Explanation's JSON fields, so scores
computed anywhere can be scored once they are put in an Explanation.
"""

from __future__ import annotations

import hashlib
import json

import torch

from ..api import resolve_model
from ..errors import LlmattrError
from ..explanation import Explanation
from ..models.loading import LoadedModel
from ..prompting import Prompt
from ..targets import SCOPES, Target
from ..tasks import TASKS
from .engine import PerturbationEngine
from .soft import PI_GRID, SoftResult, evaluate_target


def target_from_explanation(expl: Explanation) -> Target:
    """The :class:`Target` an Explanation was computed on (prompt ids, content span, explained tokens)."""
    a, b = expl.span
    if not expl.token_ids or not 0 <= a < b <= len(expl.token_ids) + len(expl.steps) - 1 or not expl.steps:
        raise LlmattrError("the explanation has no prompt tokens, an empty content span or no steps")
    offsets = [tuple(o) for o in expl.offsets]
    n = len(expl.token_ids)
    char_span = (offsets[a][0], offsets[min(b, n) - 1][1]) if len(offsets) == n else (0, 0)
    prompt = Prompt(text=expl.text, input_ids=torch.tensor([expl.token_ids]), offsets=offsets,
                    span=(a, b), char_span=char_span)
    return Target(prompt=prompt, target_ids=torch.tensor([s.token_id for s in expl.steps]), forced=expl.forced,
                  scope=expl.scope)


def check_scope(expl: Explanation, scope: str | None, mode: str = "paper") -> None:
    """Refuse metrics under a scope the explanation does not attribute (``prompt`` and ``all`` are the same
    tokens for a one-step explanation)."""
    wanted = scope or ("all" if mode == "reagent" else expl.scope)
    if wanted not in SCOPES:
        raise LlmattrError(f"scope must be one of {', '.join(SCOPES)}; got {wanted!r}")
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
    if task is not None and task.kind == "classification":
        return [0]
    return list(range(0, len(expl.steps), step_stride))


def example_key(expl: Explanation) -> str:
    """What identifies the example for seeding: the prompt ids, the span and the explained tokens."""
    data = [expl.token_ids, list(expl.span), [s.token_id for s in expl.steps]]
    return hashlib.sha256(json.dumps(data).encode()).hexdigest()


def evaluate(explanation: Explanation, model: str | LoadedModel = "default",
             metrics=("pi-soft-nc", "pi-soft-ns"), routing: str = "dynamic", samples: int = 15, seed: int = 0,
             pis=None, step_stride: int = 5, mode: str = "paper", batch_size: int | None = None,
             coupling: str = "coupled", scope: str | None = None) -> SoftResult:
    """pi-Soft-NC/NS curves and AUCs, Soft-NC/NS (alpha = 1) and E[R] of an Explanation (paper 000 sec. 3.1).

    Args:
        explanation: scored with its retain probabilities (``Step.scores``).
        model: the model it explains ("default", a spec, or a LoadedModel).
        metrics: any of "pi-soft-nc", "pi-soft-ns", "soft-nc", "soft-ns" (NC and NS families).
        routing: "dynamic" (plain forward) or "fixed" (clean attention replayed, appendix K).
        samples: Monte-Carlo samples per pi (paper: 15); seed: one user seed, derived per
            (example, step) (and method, with ``coupling="independent"``).
        pis: the pi grid (default 0.05, 0.10, ..., 0.95).
        step_stride: generation tasks are evaluated every ``step_stride``-th step and averaged.
        mode: "paper" (token masks, Hellinger, MC average) or "reagent" (the original code's reading).
        coupling: "coupled" (every method perturbed with the same uniforms: common random numbers) or
            "independent" (a stream per method, the earlier behaviour).
        scope: what is perturbed and zeroed: always what the explanation attributes (its ``scope``);
            given, it must agree. Default: the explanation's scope, but ``"all"`` with ``mode="reagent"``
            (the ReAGent evaluator perturbs the prompt and the generated prefix).
    """
    check_scope(explanation, scope, mode)
    lm = resolve_model(model)
    target = target_from_explanation(explanation)
    vocab = lm.model.get_input_embeddings().num_embeddings
    if max(explanation.token_ids + [s.token_id for s in explanation.steps]) >= vocab:
        raise LlmattrError(f"the explanation's token ids exceed {lm.model_id}'s vocabulary: "
                           f"evaluate it with the model it explains ({explanation.model})")
    result = evaluate_target(
        lm, target, explanation.score_matrix(), evaluated_steps(explanation, step_stride), metrics=metrics,
        routing=routing, samples=samples, seed=seed, pis=pis, mode=mode, example=example_key(explanation),
        method=explanation.method, batch_size=batch_size, coupling=coupling,
    )
    if explanation.model != lm.model_id:
        result.warnings.append(f"explanation made with {explanation.model}, evaluated with {lm.model_id}")
    return result


__all__ = ["PI_GRID", "PerturbationEngine", "SoftResult", "evaluate", "target_from_explanation"]
