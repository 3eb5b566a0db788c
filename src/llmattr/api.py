"""The public entry points: ``llmattr.explain`` (and the model cache they share)."""

from __future__ import annotations

import time
import warnings
from collections.abc import Sequence
from functools import lru_cache

from rich.progress import Progress, track

from . import faithfulness, methods
from .checks import check_text, check_texts
from .declarations import Catalog
from .display import span_display
from .errors import LlmattrError, NotExplainedWarning
from .explanation import Explanation, Explanations
from .faithfulness.head import head_explanation
from .lazy import torch
from .models import memory
from .models.loading import LoadedModel, load_model
from .prompting import Prompt, build_prompt, decode_pieces
from .render import progress_console
from .request import KEYWORDS, Request, field_docs, task_asked
from .targets import Target, label_target, make_target, step_probabilities, with_scope, word_target
from .tasks import TASKS, Task, get_task


@lru_cache(maxsize=2)
def _cached_model(name_or_path: str, device: str, dtype: str | None) -> LoadedModel:
    return load_model(name_or_path, device=device, dtype=dtype)


def resolve_model(model: str | LoadedModel, device: str = "auto", dtype: str | None = None) -> LoadedModel:
    """A loaded model as is, or a model name or path loaded once per process."""
    return model if isinstance(model, LoadedModel) else _cached_model(str(model), device, dtype)


def prepare(lm: LoadedModel, text: str | dict, request: Request) -> Target:
    """Prompt + target for one input: the shared first half of every explanation.

    A task with label words explains the predicted label word by default (``request.target="label"``; or
    ``"generated"``, ``"gold"``: :func:`llmattr.targets.label_target`); the gold word defaults to the
    example's ``label``. A next-word task (BLiMP) explains the greedy next token, or with ``target="gold"``
    the gold word (:func:`llmattr.targets.word_target`). A forced ``answer`` is explained as given.
    ``scope`` (``span``, ``prompt``, ``all``): what is attributed and perturbed
    (:func:`llmattr.targets.with_scope`). The request's few-shot text goes before the content span.
    With methods in the request (one, or several explained side by side), the memory guard runs before the
    model does (:func:`guard`).
    """
    check_text(text)
    task = request.task
    example = request.example(text)
    task.check_model(lm)
    prompt: Prompt = build_prompt(lm.tokenizer, task, example, request.few_shot_text(example), request.sources,
                                  request.language)
    n_new = task.max_new_tokens if request.max_new_tokens is None else request.max_new_tokens
    tokens = prompt.length + max(n_new, 1) - 1
    if request.method_objs and tokens < lm.max_length:  # longer than the context: make_target says so
        guard(lm, request.method_objs, tokens, request.checkpointing)
    gold, answer = request.gold_of(example), request.answer
    if answer is None and task.explains_label_word:
        target = label_target(lm, prompt, task, n_new, request.target, gold)
    elif answer is None and task.next_word and request.target == "gold":
        target = word_target(lm, prompt, task, gold)
    else:
        target = make_target(lm, prompt, n_new, answer)
    return with_scope(target, request.scope)


def guard(lm: LoadedModel, method_objs: Sequence[methods.AttributionMethod], tokens: int,
          checkpointing: str) -> None:
    """The memory guard before the generation (:func:`llmattr.models.memory.plan`): passes where at least one
    of the methods fits in ``tokens`` tokens, else raises the one method's refusal, or one line naming each.
    Of several methods, those that do not fit are refused one by one in :func:`attribute`, and the others kept."""
    refusals = []
    for method_obj in method_objs:
        try:
            memory.plan(lm, method_obj, tokens, checkpointing)
            return
        except LlmattrError as err:  # each refusal names its method: "saliency on 97 tokens needs ..."
            refusals.append(err)
    if len(refusals) == 1:
        raise refusals[0]
    raise LlmattrError("no method fits in memory: " + "; ".join(map(str, refusals)))


def attribute(lm: LoadedModel, target: Target, method: methods.AttributionMethod, request: Request | None = None,
              example: dict | None = None, timings: dict | None = None) -> Explanation:
    """Run ``method`` on a prepared target and package the result (the Explanation names ``request``'s task).

    The memory guard refuses a run that cannot fit (one line); the request's ``checkpointing``
    (``auto``/``on``/``off``, default ``auto``) recomputes the blocks in the backward pass instead of keeping
    their activations.
    """
    task = request.task if request else None
    checkpointing = request.checkpointing if request else "auto"
    use_checkpointing = memory.plan(lm, method, int(target.input_ids.shape[1]), checkpointing)
    start = time.perf_counter()
    with method.checkpointing(lm, use_checkpointing):
        raw, step_info = method.attribute_with_info(lm, target)
    seconds = time.perf_counter() - start
    if raw.shape != (target.n_steps, target.span[1] - target.span[0]):
        raise RuntimeError(f"{method.name} returned shape {tuple(raw.shape)}")
    tok = lm.tokenizer
    ids = target.prompt.input_ids[0].tolist()
    step_ids = target.target_ids.tolist()
    return Explanation.from_raw(
        raw, method.signed, step_info=step_info,
        step_tokens=decode_pieces(tok, step_ids), step_ids=step_ids,
        positions=target.positions.tolist(), step_probs=step_probabilities(lm, target).tolist(),
        model=lm.model_id, method=method.name, params=dict(method.params),
        tokens=[tok.decode([i]) for i in ids], token_ids=ids, span=target.span,
        timings={**(timings or {}), "attribution_s": seconds},
        task=task.name if task else None, text=target.prompt.text, offsets=target.prompt.offsets,
        generated=tok.decode(step_ids), forced=target.forced, example=example or {}, scope=target.scope,
        classification=target.classification or {}, sources=target.prompt.sources,
    )


def explain(text: str | dict | list, model: str | LoadedModel = "default",
            method: str | methods.AttributionMethod | list = "grad-ellm", task: str | Task | None = None, *,
            device: str = "auto", progress: bool = True, request: Request | None = None,
            method_params: dict | None = None, **keywords) -> Explanation | Explanations:
    """Explain the model's answer to ``text`` with ``method``.

    ``text`` is the content (for multi-field tasks such as BoolQ, a dict of fields); ``task`` the prompt recipe
    (default ``sentiment``; ``context`` with ``documents``). The other keywords are the fields of a
    :class:`~llmattr.request.Request` (below; the same list ``llmattr explain`` takes its options from), and any
    other keyword is a method parameter, as are the entries of ``method_params`` (``objective`` and ``foil`` are
    method parameters too, recorded in the Explanation's ``params``; ``target="probability"`` or ``"logit"`` is the
    objective's earlier spelling). A run that would not fit in memory is refused before the model runs.

    ``request``: a :class:`~llmattr.request.Request` holding all of that at once, instead of them
    (``explain(text, model=lm, request=Request("sst2", ["saliency"], target="gold"))``, what ``llmattr explain``
    passes); a request of several methods explains them side by side. Every value is checked when the request is
    built, before the model loads.

    Batch: a list (or tuple) of texts returns :class:`~llmattr.explanation.Explanations` (a list), the model loaded
    once, with a progress bar (``progress=False`` hides it). Every item is checked before the model loads; an item
    that fails later (too long for the model, say) is named in ``.failed`` and a warning, and the others are kept.
    Methods side by side: a list of methods (names or instances) explains each text with each of them on one model
    load and one generation; the Explanations render as one grid per text (a method that fails on a text is named
    in ``.failed`` too; the other methods' explanations of it are kept). ``timings["load_s"]`` is the time it took
    to load the model used (0 for a model built in memory and passed in).

    The fields:
    """
    fields_ = {key: keywords.pop(key) for key in list(keywords) if key in KEYWORDS}
    if request is not None and (fields_ or keywords or method_params or task is not None or method != "grad-ellm"):
        raise LlmattrError("explain(request=...): give the method, task and options to the Request, not beside it")
    if request is None:
        request = asked_request(method, task, {**(method_params or {}), **keywords}, fields_)
    if not request.methods:
        raise LlmattrError("method: give a method name (or a list of them)")
    many_methods = isinstance(method, list | tuple) or len(request.methods) > 1
    if not isinstance(text, list | tuple) and not many_methods:
        request.check_text(text)
        return explain_text(resolve_model(model, device), text, request)[0]
    texts = list(text) if isinstance(text, list | tuple) else [text]
    check_texts(texts)
    out = explain_many(resolve_model(model, device), texts, request, progress)
    if out.failed:
        warnings.warn(f"{len(out.failed)} of {len(texts)} item(s) not explained (kept the others): "
                      + "; ".join(f"item {i}: {why}" for i, why in out.failed.items()),
                      NotExplainedWarning, stacklevel=2)
    return out


def asked_request(method, task: str | Task | None, params: dict, fields_: dict) -> Request:
    """The :class:`Request` of :func:`explain`'s keywords: the method parameters ``params`` and the Request's
    ``fields_`` (``target="probability"``/``"logit"``: the objective's earlier spelling); the task by
    :func:`llmattr.request.task_asked`."""
    if fields_.get("target") in ("probability", "logit"):
        params["objective"], fields_["target"] = fields_["target"], "label"
    return Request.of(method, task_asked(task, fields_.get("documents")), params, **fields_)


explain.__doc__ += field_docs() + "\n"


def explain_many(lm: LoadedModel, texts: list, request: Request, progress: bool) -> Explanations:
    """Each text explained with each of ``request``'s methods on one model, a progress bar over the (text, method)
    explanations; a text that fails, or a method that fails on it, is named in ``.failed`` and the rest kept."""
    out = Explanations()
    units = len(texts) * len(request.method_objs)  # the bar counts (text, method) explanations
    with Progress(console=progress_console(), disable=not progress or units < 2) as bar:
        task_id = bar.add_task("explaining", total=units)
        for i, item in enumerate(texts):
            skipped: list[str] = []
            try:
                explained = explain_text(lm, item, request, skipped=skipped,
                                         advance=lambda: bar.advance(task_id))
            except LlmattrError as err:
                out.failed[i] = str(err)
                bar.update(task_id, completed=(i + 1) * len(request.method_objs))
                continue
            if skipped:
                out.failed[i] = "; ".join(skipped)
            out.extend(explained)
            out.examples += [i] * len(explained)
    return out


def naming(method: str, why: str) -> str:
    """A method's failure as ``"method: why"``, the method named once (the memory guard's own line starts with
    ``"saliency on ..."``)."""
    return why if why.startswith(f"{method} ") else f"{method}: {why}"


def explain_text(lm: LoadedModel, text: str | dict, request: Request, skipped: list[str] | None = None,
                 advance=None) -> list[Explanation]:
    """One text explained by each of the request's methods on one prompt and one generation.

    With a ``skipped`` list, a method that fails (LlmattrError: the memory guard, say) is left out and
    named there as ``"method: why"``; without it the error is raised. ``advance`` is called after each method
    (a progress bar's step)."""
    for method_obj in request.method_objs:
        if method_obj.objective:
            method_obj.explained(lm)  # a foil that is not one token fails before the generation
    if request.task.head != "lm":  # a sequence head (llmattr finetune --head; paper 003)
        example = request.example(text)
        explained = []
        for method_obj in request.method_objs:
            explained.append(head_explanation(lm, request.task, example, method_obj.name))
            if advance is not None:
                advance()
        return explained
    loaded = time.perf_counter()
    prepared_target = prepare(lm, text, request)
    prepared = time.perf_counter()
    timings = {"load_s": float(lm.info.get("load_s", 0.0)), "generate_s": prepared - loaded}
    example = request.example(text)
    explained = []
    for method_obj in request.method_objs:
        try:
            explained.append(attribute(lm, prepared_target, method_obj, request, example, timings=timings))
        except LlmattrError as err:
            if skipped is None:
                raise
            skipped.append(naming(method_obj.name, str(err)))
        if advance is not None:
            advance()
    return explained


def tokens(text: str | dict, model: str | LoadedModel = "default", task: str | Task = "sentiment",
           demonstrations: str = "", device: str = "auto") -> list[str]:
    """The content-span tokens of ``text`` as :func:`explain` and :func:`from_scores` build its prompt,
    each shown by its own characters of the text (no generation, no attribution): ``from_scores`` takes one
    score column per entry."""
    check_text(text)
    task = get_task(task)
    lm = resolve_model(model, device)
    prompt = build_prompt(lm.tokenizer, task, task.example_from_text(text), demonstrations)
    decoded = [lm.tokenizer.decode([i]) for i in prompt.input_ids[0].tolist()]
    return span_display(decoded, prompt.offsets, prompt.text, prompt.span, [])


def from_scores(text: str | dict, scores, model: str | LoadedModel = "default", task: str | Task = "sentiment",
                answer: str | None = None, method: str = "external", signed: bool = False,
                params: dict | None = None, device: str = "auto", columns: list | None = None,
                **explain_args) -> Explanation:
    """An Explanation of ``text`` holding ``scores`` computed elsewhere, so every metric can evaluate them.

    ``scores``: one row per explained step and one column per content-span token (numpy array, torch
    tensor or nested lists; a 1-D vector is one step). The prompt, the content span and the explained
    tokens are built exactly as :func:`explain` builds them (``answer`` forces the explained tokens;
    otherwise greedy generation of as many tokens as ``scores`` has rows). ``signed`` says whether the
    scores are signed (then their positive part is kept, :func:`llmattr.scores.retain_probs`).
    ``columns``: when the scores cover a whole prompt rather than the content span, the tokens of their
    columns (ids, or token strings); the content span is located in them.
    """
    try:
        raw = torch.as_tensor(scores, dtype=torch.float64)
    except (TypeError, ValueError, RuntimeError) as err:
        raise LlmattrError(f"scores must be numbers (numpy, torch or lists), got {type(scores).__name__}") from err
    raw = raw[None] if raw.dim() == 1 else raw
    if raw.dim() != 2 or raw.numel() == 0:
        raise LlmattrError(f"scores must be (steps, content tokens) or one vector, got shape {tuple(raw.shape)}")
    given = methods.GivenScores(raw, method, signed, params, columns)
    return explain(text, model, given, task, max_new_tokens=raw.shape[0], answer=answer, device=device,
                   **explain_args)


def evaluate(explanation: Explanation | list, model: str | LoadedModel = "default",
             metrics=("pi-soft-nc", "pi-soft-ns"), progress: bool = True,
             **options) -> faithfulness.SoftResult | faithfulness.MetricResult | list:
    """Score an Explanation with the model it explains (``"default"``, a spec, or a LoadedModel): the soft
    metrics by default, or any registered metric by name (:func:`llmattr.faithfulness.evaluate`).

    A list of Explanations (:class:`~llmattr.explanation.Explanations`, ``explain``'s batch) gives a list of
    results in the same order, with a progress bar (``progress=False`` hides it)."""
    many = isinstance(explanation, list | tuple)
    items = list(explanation) if many else [explanation]
    wrong = sorted({type(item).__name__ for item in items if not isinstance(item, Explanation)})
    if wrong or not items:
        raise LlmattrError(f"evaluate() takes an Explanation or a list of them (llmattr.explain's result), got "
                           f"{', '.join(wrong) if wrong else 'an empty list'}")
    lm = resolve_model(model)
    results = [faithfulness.evaluate(item, lm, metrics=metrics, **options)
               for item in track(items, description="evaluating", disable=not progress or not many,
                                 console=progress_console())]
    return results if many else results[0]


def catalog() -> Catalog:
    """What ``llmattr report`` needs from the registries: every registered metric's tables and each
    method's defaults (for method labels), and the control methods (``AttributionMethod.control``)."""
    return Catalog(faithfulness.table_specs(), {name: cls.defaults for name, cls in methods.REGISTRY.items()},
                   faithfulness.figure_specs(),
                   {name: cls.layer_sweep for name, cls in methods.REGISTRY.items() if cls.layer_sweep},
                   {name: (task.report_order, task.display or name) for name, task in TASKS.items()},
                   tuple(name for name, cls in methods.REGISTRY.items() if cls.control),
                   tuple(name for name, task in TASKS.items() if task.head != "lm"))
