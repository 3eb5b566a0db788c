"""Gradient methods on the input embeddings: Saliency and Input x Gradient, and the helpers they share.

Every method of the gradient family (this module, ``integrated.py``, ``deeplift.py``) explains

* ``F_t``: the **probability** of the explained token ``target_ids[t]`` at step ``t`` by default (Inseq's
  default attributed function, through which paper 000 computed its baselines; paper 004 explains the
  output probability too); ``objective`` picks another one of :mod:`llmattr.objectives` (``logit``:
  Grad-ELLM's quantity; ``log-prob``; ``contrast`` with a ``foil``: ``logit(y_t) - logit(foil)``);
* w.r.t. the input embeddings ``lm.embed(target.input_ids)`` as fed to the first layer;
* with one causal forward for all steps and one backward of batched vector-Jacobian products
  (:func:`llmattr.methods.backprop.step_gradients`); logits only at the explained positions.

Embedding-level attributions ``(..., D)`` are reduced to one score per token by :func:`reduce_tokens`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from .. import objectives
from ..errors import LlmattrError
from ..lazy import no_grad, torch
from ..models.forward import logits_at, prefix_cache, zero_input_logits
from ..models.loading import LoadedModel
from ..models.memory import prefix_cache_pays
from ..targets import Target
from .backprop import step_gradients
from .base import AttributionMethod, choice, register

if TYPE_CHECKING:
    from torch import Tensor
    from transformers.cache_utils import Cache

REDUCTIONS = ("l2", "sum", "l1")
BASELINES = ("all", "span", "unk")  # the path baseline x0: which input embeddings it zeroes, or unk (not a scope)

ScoreFn = Callable[["Tensor"], "Tensor"]  # embeddings (B, S, D) -> F (B, T)


def reduce_tokens(attr: torch.Tensor, reduction: str) -> torch.Tensor:
    """One score per token from embedding-level attributions ``(..., D)``.

    ``l2``: Euclidean norm over the embedding dim (Saliency's gradient norm, Simonyan et al. 2014 as in
    Inseq); ``sum``: sum over the embedding dim (Input x Gradient, IG, DeepLIFT: keeps completeness /
    summation-to-delta); ``l1``: sum of absolute values (paper 003 sec. 4.1, "l1 norm for aggregation").
    """
    if reduction == "sum":
        return attr.sum(-1)
    if reduction == "l2":
        return torch.linalg.vector_norm(attr, ord=2, dim=-1)
    if reduction == "l1":
        return attr.abs().sum(-1)
    raise LlmattrError(f"reduction must be one of {', '.join(REDUCTIONS)}; got {reduction!r}")


def target_scores(lm: LoadedModel, embeds: torch.Tensor, positions: torch.Tensor, target_ids: torch.Tensor,
                  objective: str = "probability", foil_ids: torch.Tensor | None = None, **kwargs) -> torch.Tensor:
    """``F_t`` for every batch row ``(B, T)``: the ``objective`` (:mod:`llmattr.objectives`) of
    ``target_ids[t]`` (against ``foil_ids``) at ``positions[t]``; the LM head runs at those positions only."""
    explained = objectives.get(objective, foil_ids)
    return explained(logits_at(lm, embeds, positions, **kwargs), target_ids, foil_ids)


def score_fn(lm: LoadedModel, target: Target, kind: str, prefix: int = 0,
             foil_ids: torch.Tensor | None = None) -> ScoreFn:
    """The embedding-level function explained: ``embeds (B, S, D) -> F (B, T)``, ``F`` the objective ``kind``
    (against the foil token ``foil_ids`` for a contrastive one).

    ``prefix > 0``: the first ``prefix`` tokens (the template before the content span) run once without
    gradients into a key/value cache and the rest attends to it, so the backward pass never enters the
    prefix. ``F`` and the gradients of every later token are unchanged (a causal model's prefix does not
    depend on later tokens); the gradients of the prefix tokens come out as zero. On long inputs, where the
    attention masks the cache forces would cost more memory than it saves (:func:`~..models.memory.prefix_cache_pays`),
    the prefix runs through the graph instead: the same ``F`` and span gradients.
    """
    if not prefix_cache_pays(lm, prefix, int(target.input_ids.shape[1])):
        return suffix_score_fn(lm, target, kind, 0, foil_ids)
    after = suffix_score_fn(lm, target, kind, prefix, foil_ids)
    return lambda embeds: after(embeds[:, prefix:], prefix_cache(lm, embeds[:, :prefix]))


def suffix_score_fn(lm: LoadedModel, target: Target, kind: str, prefix: int,
                    foil_ids: torch.Tensor | None = None) -> Callable[..., torch.Tensor]:
    """``F`` of the tokens after the first ``prefix``: ``(embeds (B, S - prefix, D), cache) -> (B, T)``, the
    prefix's keys and values in ``cache`` (none when ``prefix`` is 0)."""
    positions = target.positions.to(lm.device) - prefix

    def f(embeds: torch.Tensor, cache: Cache | None = None) -> torch.Tensor:
        if cache is None:
            return target_scores(lm, embeds, positions, target.target_ids, kind, foil_ids)
        return target_scores(lm, embeds, positions, target.target_ids, kind, foil_ids, cache=cache,
                             use_cache=True)
    return f


def embedding_gradients(f: ScoreFn, embeds: torch.Tensor, *others: torch.Tensor
                        ) -> tuple[torch.Tensor, torch.Tensor, ...]:
    """``F`` at ``embeds`` ``(B, T)`` and ``dF_t/d embeds`` ``(T, B, S, D)`` (then ``dF_t/d other`` for each
    tensor of ``others`` that ``f`` reads and that requires a gradient, ``(T, *other.shape)``).

    One forward; one backward whose T vector-Jacobian products are batched (rows are independent, so
    the gradient of ``sum_b F[b, t]`` holds each row's own gradient).
    """
    embeds = embeds.detach().requires_grad_(True)
    with torch.enable_grad():
        scores = f(embeds)
        grads = step_gradients(scores.sum(0), [embeds, *others])
    return (scores.detach(), *grads)


def baseline_embeds(lm: LoadedModel, embeds: torch.Tensor, target: Target, baseline: str) -> torch.Tensor:
    """The baseline ``x0`` of the path and reference methods (their parameter ``baseline``, one of :data:`BASELINES`).

    ``all``: every input embedding zero (paper 004 algorithm A.3, ``x0 = 0``); ``span``: only the content
    span zero, template and generated prefix kept; ``unk``: Inseq's baseline, and so what paper 000's IG,
    DeepLIFT and GradientSHAP columns used: the unknown token's embedding at every position except those
    of the end-of-sequence token, which stay (Inseq's ``include_eos_baseline=False`` default). ``all`` and
    ``span`` say which embeddings the baseline replaces, not what is attributed (an explanation's ``scope``):
    the scores cover the content span either way.
    """
    if baseline == "all":
        return torch.zeros_like(embeds)
    if baseline == "unk":
        unk, eos = lm.tokenizer.unk_token_id, lm.tokenizer.eos_token_id
        if unk is None:
            raise LlmattrError("baseline 'unk' needs a tokenizer with an unknown token; use 'all' or 'span'")
        ids = target.input_ids.to(embeds.device)
        keep = ids == eos if eos is not None else torch.zeros_like(ids, dtype=torch.bool)
        with torch.no_grad():
            return lm.embed(torch.where(keep, ids, torch.full_like(ids, unk))).to(embeds.dtype)
    a, b = target.span
    mask = torch.zeros(embeds.shape[-2], 1, dtype=torch.bool, device=embeds.device)
    mask[a:b] = True
    return torch.where(mask, torch.zeros_like(embeds), embeds)


def convergence(attr: torch.Tensor, target_delta: torch.Tensor, rest: torch.Tensor | None = None) -> dict:
    """Completeness per step (Captum's ``convergence_delta``): ``target_delta = F(x) - F(x0)`` and
    ``convergence_delta = sum_i sum_d attr_tid - target_delta`` over every input token, from embedding-level
    attributions ``(T, S, D)`` and ``rest`` ``(T,)``, the summed attributions of tokens not in ``attr`` (a
    cached template's share, :class:`~..models.forward.PathPrefix`); float64 lists, one value per step."""
    target_delta = target_delta.detach().double().cpu()
    total = attr.detach().double().sum((1, 2)).cpu()
    if rest is not None:
        total = total + rest.detach().double().cpu()
    return {"target_delta": target_delta.tolist(), "convergence_delta": (total - target_delta).tolist()}


@no_grad
def endpoint_delta(lm: LoadedModel, target: Target, explained: objectives.Objective, foil_ids: torch.Tensor | None,
                   f: ScoreFn, x: torch.Tensor, x0: torch.Tensor) -> torch.Tensor:
    """``F(x) - F(x0)`` per step ``(T,)``, running only the endpoints whose value is not known already.

    ``F(x)``: the ``explained`` objective of the logits the generation read at each explained position
    (``target.step_logits``; a forced answer has none). ``F(x0)`` of an all-zero baseline: that of
    :func:`~..models.forward.zero_input_logits` (the zero input is the same in every example). What is left runs
    through ``f`` as batch rows of one forward.
    """
    ids = target.target_ids.to(lm.device)
    known = [None if target.step_logits is None else target.step_logits[None].to(lm.device),
             None if x0.any() else zero_input_logits(lm, target.positions.to(lm.device), x0)]
    ends = [None if logits is None else explained(logits, ids, foil_ids)[0] for logits in known]
    missing = [i for i, end in enumerate(ends) if end is None]
    if missing:
        for i, row in zip(missing, f(torch.cat([(x, x0)[i] for i in missing])), strict=True):
            ends[i] = row
    return ends[0] - ends[1].to(ends[0])


def last_token_logits(model: torch.nn.Module, embeds: torch.Tensor) -> torch.Tensor:
    """The head's logits ``(B, labels)`` on the last token's state of unpadded ``embeds`` ``(B, S, D)``: what
    transformers' ``*ForSequenceClassification`` reads when given ``inputs_embeds`` (it cannot look for padding
    there, and warns so), computed from the base model and the ``score`` layer, for the last position only."""
    hidden = getattr(model, model.base_model_prefix)(inputs_embeds=embeds).last_hidden_state
    return model.score(hidden[:, -1])


def head_function(model: torch.nn.Module, label: int | None) -> ScoreFn:
    """``F(embeds (B, S, D)) -> (B, 1)``: the head's probability of ``label``, or a regression head's output."""
    def f(embeds: torch.Tensor) -> torch.Tensor:
        logits = last_token_logits(model, embeds).float()
        return logits[:, :1] if label is None else logits.softmax(-1)[:, [label]]
    return f


def head_inputs(model: torch.nn.Module, input_ids: torch.Tensor) -> tuple[torch.Tensor, ScoreFn]:
    """The input embeddings ``(1, S, D)`` of a sequence head's model and what paper 003's gradient methods
    differentiate: the probability of the predicted label (a regression head: its output), :func:`head_function`."""
    with torch.no_grad():
        logits = model(input_ids=input_ids).logits[0]
    f = head_function(model, None if logits.numel() == 1 else int(logits.argmax()))
    return model.get_input_embeddings()(input_ids).detach(), f


def head_gradient_scores(model: torch.nn.Module, input_ids: torch.Tensor, times_input: bool) -> torch.Tensor:
    """Paper 003's Grad. Norm (``times_input=False``) or G x I of a sequence head: ``dF/dx_i`` (or ``x_i * dF/dx_i``)
    reduced by the l1 norm ("using the l1 norm for aggregation"), ``(S,)`` float64."""
    x, f = head_inputs(model, input_ids)
    _, grads = embedding_gradients(f, x)
    return reduce_tokens((grads[0, 0] * x[0] if times_input else grads[0, 0]).float(), "l1").double()


def span_scores(attr: torch.Tensor, target: Target, reduction: str) -> torch.Tensor:
    """Reduce ``(T, S, D)`` attributions to tokens and keep the content span: ``(T, n_span)`` float32."""
    a, b = target.span
    return reduce_tokens(attr[:, a:b].float(), reduction).detach()


class EmbeddingGradientMethod(AttributionMethod):
    """Base of the methods that differentiate ``F_t`` w.r.t. the input embeddings."""

    needs_gradients = True
    objective = "probability"
    defaults = {"objective": "probability", "reduction": "sum"}
    rules = {"reduction": choice(REDUCTIONS), "baseline": choice(BASELINES)}
    memory_kind = "backward"

    def score_fn(self, lm: LoadedModel, target: Target, prefix: int = 0) -> ScoreFn:
        """:func:`score_fn` of this method's ``objective`` and foil."""
        return score_fn(lm, target, self.params["objective"], prefix, self.explained(lm)[1])

    def gradients(self, lm: LoadedModel, target: Target) -> tuple[torch.Tensor, torch.Tensor]:
        """Input embeddings ``(1, S, D)`` and ``dF_t/dx`` ``(T, 1, S, D)``: one forward, one backward."""
        embeds = lm.embed(target.input_ids)
        f = self.score_fn(lm, target, prefix=target.span[0])  # only span gradients are used
        _, grads = embedding_gradients(f, embeds)
        return embeds, grads


@register
class Saliency(EmbeddingGradientMethod):
    """Vanilla gradient (Simonyan et al. 2014): ``||dF_t / dx_i||_2`` per token."""

    name = "saliency"
    family = "gradient"
    summary = "Saliency: L2 norm of the gradient of the target probability w.r.t. each token's embedding"
    signed = False
    cost = "1 forward + 1 backward (all steps share them)"
    defaults = {"objective": "probability", "reduction": "l2"}

    def attribute(self, lm: LoadedModel, target: Target) -> torch.Tensor:
        _, grads = self.gradients(lm, target)
        return span_scores(grads[:, 0], target, self.params["reduction"])

    @classmethod
    def head_scores(cls, model: torch.nn.Module, input_ids: torch.Tensor, seed: int = 0) -> torch.Tensor:
        """Paper 003's Grad. Norm: ``||dF/dx_i||_1``."""
        return head_gradient_scores(model, input_ids, times_input=False)


@register
class InputXGradient(EmbeddingGradientMethod):
    """Input x Gradient (Shrikumar et al. 2016): ``sum_d x_id * dF_t / dx_id``."""

    name = "input-x-gradient"
    family = "gradient"
    summary = "Input x Gradient: embedding times gradient of the target probability, summed over dims"
    signed = True
    cost = "1 forward + 1 backward (all steps share them)"

    def attribute(self, lm: LoadedModel, target: Target) -> torch.Tensor:
        embeds, grads = self.gradients(lm, target)
        return span_scores(embeds * grads[:, 0], target, self.params["reduction"])

    @classmethod
    def head_scores(cls, model: torch.nn.Module, input_ids: torch.Tensor, seed: int = 0) -> torch.Tensor:
        """Paper 003's G x I: ``||x_i * dF/dx_i||_1``."""
        return head_gradient_scores(model, input_ids, times_input=True)
