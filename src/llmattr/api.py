"""The public entry points: ``llmattr.explain`` (and the model cache they share)."""

from __future__ import annotations

import time
from functools import lru_cache

from . import methods
from .errors import LlmattrError
from .explanation import Explanation
from .models import memory
from .models.loading import LoadedModel, load_model
from .prompting import Prompt, build_prompt
from .targets import SCOPES, TARGET_MODES, Target, label_target, make_target, with_scope
from .tasks import Task, few_shot, get_task


@lru_cache(maxsize=2)
def _cached_model(spec: str, device: str, dtype: str | None) -> LoadedModel:
    return load_model(spec, device=device, dtype=dtype)


def resolve_model(model: str | LoadedModel, device: str = "auto", dtype: str | None = None) -> LoadedModel:
    """A loaded model as is, or a spec loaded once per process."""
    return model if isinstance(model, LoadedModel) else _cached_model(str(model), device, dtype)


def prepare(lm: LoadedModel, text: str | dict, task: Task, max_new_tokens: int | None = None,
            answer: str | None = None, demonstrations: str = "", target: str = "label",
            gold: str | None = None, scope: str = "span", method: methods.AttributionMethod | None = None,
            checkpointing: str = "auto") -> Target:
    """Prompt + target for one input: the shared first half of every explanation.

    A task with label words explains the predicted label word by default (``target="label"``; or
    ``"generated"``, ``"gold"``: :func:`llmattr.targets.label_target`); ``gold`` defaults to the
    example's ``label``. A forced ``answer`` is explained as given. ``scope`` (``span``, ``prompt``,
    ``all``): what is attributed and perturbed (:func:`llmattr.targets.with_scope`).
    With ``method``, the memory guard runs before the model does (:func:`llmattr.models.memory.plan`).
    """
    if isinstance(text, str) and not text.strip():
        raise LlmattrError("empty text: give the text to explain")
    if target not in TARGET_MODES:
        raise LlmattrError(f"target must be one of {', '.join(TARGET_MODES)}; got {target!r}")
    if scope not in SCOPES:
        raise LlmattrError(f"scope must be one of {', '.join(SCOPES)}; got {scope!r}")
    example = task.example_from_text(text)
    task.check_model(lm)
    prompt: Prompt = build_prompt(lm.tokenizer, task, example, demonstrations)
    n_new = task.max_new_tokens if max_new_tokens is None else max_new_tokens
    tokens = prompt.length + max(n_new, 1) - 1
    if method is not None and tokens < lm.max_length:  # longer than the context: make_target says so
        memory.plan(lm, method, tokens, checkpointing)
    if answer is None and task.label_words and task.head == "lm" and task.kind != "lm":
        gold = example.get("label") if gold is None else gold
        return with_scope(label_target(lm, prompt, task, n_new, target, gold), scope)
    return with_scope(make_target(lm, prompt, n_new, answer), scope)


def attribute(lm: LoadedModel, target: Target, method: methods.AttributionMethod, task: Task | None = None,
              example: dict | None = None, timings: dict | None = None, checkpointing: str = "auto") -> Explanation:
    """Run ``method`` on a prepared target and package the result.

    The memory guard refuses a run that cannot fit (one line); ``checkpointing`` (``auto``/``on``/``off``)
    recomputes the blocks in the backward pass instead of keeping their activations.
    """
    use_checkpointing = memory.plan(lm, method, int(target.input_ids.shape[1]), checkpointing)
    start = time.perf_counter()
    with memory.checkpointed(lm, use_checkpointing):
        raw, step_info = method.attribute_with_info(lm, target)
    seconds = time.perf_counter() - start
    if raw.shape != (target.n_steps, target.span[1] - target.span[0]):
        raise RuntimeError(f"{method.name} returned shape {tuple(raw.shape)}")
    tok = lm.tokenizer
    ids = target.prompt.input_ids[0].tolist()
    step_ids = target.target_ids.tolist()
    return Explanation.from_raw(
        raw, method.signed, step_info=step_info,
        step_tokens=[tok.decode([i]) for i in step_ids], step_ids=step_ids,
        positions=target.positions.tolist(),
        model=lm.model_id, method=method.name, params=dict(method.params),
        tokens=[tok.decode([i]) for i in ids], token_ids=ids, span=target.span,
        timings={**(timings or {}), "attribution_s": seconds},
        task=task.name if task else None, text=target.prompt.text, offsets=target.prompt.offsets,
        generated=tok.decode(step_ids), forced=target.forced, example=example or {}, scope=target.scope,
        classification=target.classification or {},
    )


def explain(
    text: str | dict,
    model: str | LoadedModel = "default",
    method: str = "grad-ellm",
    task: str | Task = "sentiment",
    max_new_tokens: int | None = None,
    answer: str | None = None,
    device: str = "auto",
    shots: int = 0,
    shots_seed: int = 0,
    demonstrations: str = "",
    target: str = "label",
    gold: str | None = None,
    scope: str = "span",
    checkpointing: str = "auto",
    method_params: dict | None = None,
    **params,
) -> Explanation:
    """Explain the model's answer to ``text`` with ``method``.

    ``text`` is the content (for multi-field tasks such as BoolQ, a dict of fields); ``answer`` forces
    the explained tokens instead of greedy generation. ``shots`` few-shot demonstrations (drawn with
    ``shots_seed`` from the task's sample data, never ``text`` itself) or an explicit ``demonstrations``
    text are placed before the content span, so they are neither attributed nor perturbed. A run that would
    not fit in memory is refused before the model runs; ``checkpointing`` is ``auto``, ``on`` or ``off``
    (see :mod:`llmattr.models.memory`).

    ``target``: for a task with label words, which token is explained: ``"label"`` (the predicted
    label word, default), ``"generated"`` (the free greedy answer) or ``"gold"`` (the gold label word:
    ``gold``, or the ``label`` field of a dict ``text``). ``"probability"``/``"logit"`` are passed on to
    the method as its explained quantity (the gradient methods' ``target`` parameter). Method parameters
    come as keywords or as the dict ``method_params`` (which may hold ``target``).

    ``scope``: what is attributed, and later perturbed and zeroed by the metrics: ``"span"`` (the content,
    default), ``"prompt"`` (every prompt token, template included: paper 000's pipeline) or ``"all"``
    (prompt and generated prefix: the ReAGent evaluator code).
    """
    method_params = {**(method_params or {}), **params}
    if target in ("probability", "logit"):
        method_params["target"], target = target, "label"
    task = get_task(task)
    method_obj = methods.get(method, **method_params)
    start = time.perf_counter()
    lm = resolve_model(model, device)
    loaded = time.perf_counter()
    example = task.example_from_text(text)
    if shots:
        demonstrations += few_shot(task, shots, shots_seed, exclude=[{"id": None, **example}])
    prepared_target = prepare(lm, text, task, max_new_tokens, answer, demonstrations, target, gold,
                              scope, method_obj, checkpointing)
    prepared = time.perf_counter()
    return attribute(lm, prepared_target, method_obj, task, example,
                     timings={"load_s": loaded - start, "generate_s": prepared - loaded},
                     checkpointing=checkpointing)
