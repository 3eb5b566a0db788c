"""Layer-wise Relevance Propagation for transformers: AttnLRP (Achtibat et al., ICML 2024) and CP-LRP (Ali et
al., ICML 2022), in the efficient input x gradient form, for every architecture through one set of rules.

LRP redistributes the relevance ``R_j`` of each output ``y_j`` of an operation onto its inputs ``x_i``. Every rule
used here has the form ``R_i = x_i g_i``, with ``g`` the gradient of the explained score ``F`` once some operations'
backward is changed, so one backward pass carries the relevance through the whole network and the relevance of
input token ``i`` is ``R_i = sum_d x_id g_id`` (input x modified gradient, ``x`` the input embeddings):

* **linear operations** (projections, RoPE, residual sums, head mixing, the LM head): the gradient itself,
  LRP's epsilon rule with ``epsilon -> 0``: ``R_i = sum_j x_i W_ji R_j / z_j`` with ``R_j = z_j g_j`` gives
  ``g_i = sum_j W_ji g_j``;
* **products of two input-dependent factors** ``y = a * b`` (the gated MLP's ``act(gate) * up``) and the two
  attention products ``q k^T`` and ``p v``: the **uniform rule** (AttnLRP eq. 7), ``R_a = R_b = R_y / 2``, i.e.
  each factor gets half its gradient, ``g_a = b g_y / 2``, ``g_b = a g_y / 2``;
* **element-wise activations** ``y = sigma(x)`` (SiLU, GELU, ...): the **identity rule** (eq. 9), ``R_x = R_y``,
  i.e. ``g_x = g_y sigma(x) / x`` (0 where ``x = 0``, whose relevance ``x g_x`` is 0 anyway);
* **normalisation** (RMSNorm ``y = w x / rms(x)``, LayerNorm ``y = w (x - mean x) / std(x) + b``): the identity
  rule on the normaliser, ``rms(x)`` / ``std(x)`` held constant (detached), so the layer is linear in ``x``;
* **softmax** ``s = softmax(z)`` (AttnLRP prop. 3.1): ``R_z_i = z_i (R_s_i - s_i sum_j R_s_j)``, which with
  ``R_s = s g_s`` is ``z_i (J^T g_s)_i``: the plain gradient. So in attention ``o = softmax(q k^T c + m) v``, the
  uniform rule on ``p v`` halves the gradient of ``v`` and of ``p``, and the uniform rule on ``q k^T`` halves what
  reaches ``q`` and ``k`` again: ``g_q``, ``g_k`` are a quarter and ``g_v`` half of sdpa's gradient, which is
  how it runs, in PyTorch's memory-efficient ``scaled_dot_product_attention`` (no ``(S, S)`` tensor);
* **CP-LRP** (``cp-lrp``): the attention probabilities are constants (no relevance through the softmax), so
  ``o = p v`` is linear in ``v``: ``g_q = g_k = 0`` and ``g_v`` is the gradient; likewise the gate of a gated
  MLP, ``act(gate) * up`` with ``act(gate)`` constant, is linear in ``up`` (lxt's CP-LRP).

Conservation. Each rule is exact except where a constant is added: ``F = sum_i R_i + sum_b b . g_b`` over the
bias terms ``b``: linear and LayerNorm biases (GPT-2, Qwen2's q/k/v), learned position embeddings (GPT-2), and
(AttnLRP only) the softmax's own Taylor bias ``s - J z`` at every attention row. Bias-free models under CP-LRP
conserve exactly; ``tests/test_attnlrp.py`` checks the identity with every bias term counted.

One implementation for every architecture: the rules are a :class:`torch.overrides.TorchFunctionMode` active
inside the model's forward only (the objective on the logits keeps its own gradient), which sees the torch calls
of llmattr's one attention function (sdpa, or its eager path), of every RMSNorm (``rsqrt``) and LayerNorm and of
the gated products, plus the activation modules (``transformers.activations``) patched by type; both enter
through :mod:`llmattr.models.intercept` (``ruled``, ``Patched``), transparent to passes without gradients.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache, partial
from typing import TYPE_CHECKING, ClassVar

from ..lazy import F, derived, lazy, torch
from ..models import memory
from ..models.intercept import Patched, Rules, ruled
from ..models.loading import LoadedModel
from ..targets import Target
from .base import register
from .gradient import EmbeddingGradientMethod, embedding_gradients, span_scores

if TYPE_CHECKING:
    from torch import Tensor as T

activations = lazy("transformers.activations")
GATE = "_llmattr_lrp_gate"  # marks an activation module's output (a gate where it multiplies another branch)


@dataclass(frozen=True)
class Calls:
    """The torch calls the rules tell apart (read on first use: they are torch's and transformers' objects)."""

    elementwise: frozenset
    products: frozenset  # element-wise and matrix products
    softmax: frozenset
    normalisers: frozenset  # RMSNorm's 1 / rms(x)
    activations: tuple  # the activation modules' classes


@cache
def calls() -> Calls:
    T = torch.Tensor
    elementwise = frozenset({T.__mul__, T.__rmul__, torch.mul, T.mul})
    return Calls(elementwise, elementwise | {torch.matmul, T.__matmul__, T.matmul, torch.bmm, T.bmm},
                 frozenset({torch.softmax, T.softmax, F.softmax}), frozenset({torch.rsqrt, T.rsqrt}),
                 tuple({c[0] if isinstance(c, tuple) else c for c in activations.ACT2CLS.values()} | {torch.nn.GELU}))


def _relevant(x) -> bool:
    """Whether ``x`` carries relevance (depends on the input embeddings: it requires a gradient)."""
    return isinstance(x, torch.Tensor) and x.requires_grad


class ScaledGradientBody:
    """Identity forward; the backward multiplies the gradient by ``factor`` (the uniform rule's share)."""

    @staticmethod
    def forward(ctx, x: T, factor: float) -> T:
        ctx.factor = factor
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: T):
        return grad * ctx.factor, None


class IdentityRuleBody:
    """``y = sigma(x)`` forward; backward ``g_x = g_y sigma(x) / x`` (0 where ``x = 0``): ``R_x = R_y``."""

    @staticmethod
    def forward(ctx, forward: Callable[[T], T], x: T) -> T:
        y = forward(x.detach())
        ctx.save_for_backward(torch.where(x == 0, torch.zeros_like(y), y / x))
        return y

    @staticmethod
    def backward(ctx, grad: T):
        (ratio,) = ctx.saved_tensors
        return None, grad * ratio


ScaledGradient = derived("ScaledGradient", ScaledGradientBody, lambda: torch.autograd.Function)
IdentityRule = derived("IdentityRule", IdentityRuleBody, lambda: torch.autograd.Function)


def scaled(x: T, factor: float) -> T:
    return ScaledGradient.apply(x, factor)


def identity_rule(forward: Callable[[T], T], x: T, *args, **kwargs) -> T:
    """An activation module's forward under the identity rule (extra arguments: none expected, passed on)."""
    if args or kwargs or not _relevant(x):
        return forward(x, *args, **kwargs)
    y = IdentityRule.apply(forward, x)
    setattr(y, GATE, True)
    return y


def layer_norm(x: T, shape, weight: T | None = None, bias: T | None = None, eps: float = 1e-5) -> T:
    """``w (x - mean x) / std(x) + b`` with ``std(x)`` detached (the identity rule on the normaliser)."""
    dims = tuple(range(-len(shape), 0))
    centred = x - x.mean(dims, keepdim=True)
    y = centred * torch.rsqrt(centred.square().mean(dims, keepdim=True) + eps).detach()
    y = y * weight if weight is not None else y
    return y + bias if bias is not None else y


def rms_norm(x: T, shape, weight: T | None = None, eps: float | None = None) -> T:
    """``w x / rms(x)`` with ``rms(x)`` detached (``F.rms_norm``'s default eps: the dtype's machine epsilon)."""
    dims = tuple(range(-len(shape), 0))
    eps = torch.finfo(x.dtype).eps if eps is None else eps
    y = x * torch.rsqrt(x.square().mean(dims, keepdim=True) + eps).detach()
    return y * weight if weight is not None else y


class RelevanceRulesBody:
    """The rules of the module docstring on the torch calls of a forward pass (``constant_attention``: CP-LRP,
    attention probabilities and gates held constant).

    Calls on tensors that carry no relevance (no gradient: weights, masks, RoPE tables, a cached prefix) pass
    through unchanged."""

    def __init__(self, constant_attention: bool = False):
        super().__init__()
        self.constant_attention = constant_attention

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs, known = kwargs or {}, calls()
        if func is F.scaled_dot_product_attention and len(args) >= 3:
            return func(*self.attention_operands(*args[:3]), *args[3:], **kwargs)
        if func in known.products and len(args) > 1 and _relevant(args[0]) and _relevant(args[1]):
            return func(*self.product_operands(func, *args[:2]), *args[2:], **kwargs)
        if func in known.normalisers and _relevant(args[0]):
            return func(*args, **kwargs).detach()
        if func is F.layer_norm and _relevant(args[0]):
            return layer_norm(*args, **kwargs)
        if func is F.rms_norm and _relevant(args[0]):
            return rms_norm(*args, **kwargs)
        if func in known.softmax and self.constant_attention and _relevant(args[0]):
            return func(*args, **kwargs).detach()  # the eager path's attention probabilities
        return func(*args, **kwargs)

    def product_operands(self, func, a: T, b: T) -> tuple[T, T]:
        """Two relevant factors: halves of the gradient each (uniform rule), or under CP-LRP an element-wise
        product with a gate (an activation's output) keeps the gate constant."""
        gated = getattr(a, GATE, False) or getattr(b, GATE, False)
        if self.constant_attention and func in calls().elementwise and gated:
            return (a.detach() if getattr(a, GATE, False) else a), (b.detach() if getattr(b, GATE, False) else b)
        return scaled(a, 0.5), scaled(b, 0.5)

    def attention_operands(self, q: T, k: T, v: T) -> tuple[T, T, T]:
        """sdpa's ``q``, ``k``, ``v`` with their shares: ``1/4``, ``1/4``, ``1/2`` (AttnLRP) or ``0``, ``0``, ``1``
        (CP-LRP)."""
        if self.constant_attention:
            return q.detach(), k.detach(), v
        return tuple(scaled(t, share) if _relevant(t) else t for t, share in ((q, 0.25), (k, 0.25), (v, 0.5)))


RelevanceRules = derived("RelevanceRules", RelevanceRulesBody, lambda: torch.overrides.TorchFunctionMode)


@contextmanager
def relevance_rules(model: torch.nn.Module, constant_attention: bool = False) -> Iterator[None]:
    """For the duration, ``model``'s forward runs under :class:`RelevanceRules` and its activation modules under
    the identity rule; a backward pass then propagates relevance (``input x gradient = R``)."""
    activations = [m for m in model.modules() if isinstance(m, calls().activations)]
    with Patched(activations, lambda _, forward: partial(identity_rule, forward), transparent=True), \
            ruled(model, partial(RelevanceRules, constant_attention)):
        yield


def relevance(lm: LoadedModel, f: Callable[[T], T], embeds: T, constant_attention: bool = False
              ) -> tuple[T, T]:
    """``F(x)`` ``(1, T)`` and the relevance ``x * g`` ``(T, S, D)`` of every input embedding for each step's
    score: one forward under the rules, one backward of the T steps' batched vector-Jacobian products."""
    with relevance_rules(lm.model, constant_attention):
        scores, grads = embedding_gradients(f, embeds)
    return scores, (embeds * grads[:, 0]).detach()


@register
class AttnLRP(EmbeddingGradientMethod):
    """AttnLRP (Achtibat et al. 2024): relevance of each input token for each step's logit (module docstring)."""

    name = "attnlrp"
    family = "relevance propagation"
    summary = "AttnLRP: layer-wise relevance (uniform rule on attention and gates, identity on norms/activations)"
    signed = True
    cost = "1 forward + 1 backward (all steps share them)"
    objective = "logit"
    defaults = {"objective": "logit", "reduction": "sum"}
    constant_attention: ClassVar[bool] = False

    def checkpointing(self, lm: LoadedModel, enable: bool):
        """Block checkpointing whose recomputation runs under the same rules."""
        return memory.checkpointed(lm, enable, recompute=lambda: Rules(RelevanceRules(self.constant_attention)))

    def attribute(self, lm: LoadedModel, target: Target) -> torch.Tensor:
        embeds = lm.embed(target.input_ids).detach()
        f = self.score_fn(lm, target, prefix=target.span[0])  # only span relevances are returned
        _, attr = relevance(lm, f, embeds, self.constant_attention)
        return span_scores(attr, target, self.params["reduction"])


@register
class CPLRP(AttnLRP):
    """CP-LRP (Ali et al. 2022): LRP with the attention probabilities (and gates) held constant."""

    name = "cp-lrp"
    summary = "CP-LRP: layer-wise relevance with attention probabilities and MLP gates held constant"
    constant_attention = True
