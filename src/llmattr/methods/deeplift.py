"""DeepLIFT (Shrikumar et al. 2017) on the input embeddings, with real rules for a transformer's
non-linearities, and ``deeplift-ixg``: what Captum's ``DeepLift`` (hence Inseq, hence papers 000/004)
computes on a Llama-style model.

``deeplift`` runs the reference ``x0`` and the input ``x`` through the same code under a
``TorchFunctionMode`` that sees every torch call. The reference pass records the operands of each
non-linear call; the input pass returns the true value of each call but gives it the DeepLIFT
multiplier instead of the gradient:

* element-wise non-linearities (SiLU, GELU, tanh, sigmoid, exp, rsqrt, sqrt, pow, reciprocal, ReLU, erf):
  the **rescale rule** ``m = (f(x) - f(x0)) / (x - x0)`` (the gradient where ``x`` and ``x0`` are equal or
  adjacent float32 numbers, ``|x - x0| <= 1e-7 max(|x|, |x0|)``);
* products of two input-dependent tensors (``*``, ``/``, ``matmul``: SwiGLU's gate, RMSNorm's
  ``x * rsqrt(.)``, ``q k^T``, ``probs @ v``): the multipliers ``(b + b0)/2`` and ``(a + a0)/2``, for which
  ``ab - a0 b0 = (b + b0)/2 (a - a0) + (a + a0)/2 (b - b0)`` holds exactly (the Shapley value of the
  two-factor product);
* softmax (attention and the output probability) and LayerNorm: decomposed into the above (``exp`` with a
  shift shared by both passes, a sum, a reciprocal and a product; centring, ``pow``, ``rsqrt``, product).

Linear operations keep their gradient, which is their multiplier. The chain rule for multipliers then
gives ``sum_i (x_i - x0_i) m_i = F(x) - F(x0)`` (summation-to-delta) up to float error.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from fractions import Fraction
from functools import cache, partial
from typing import TYPE_CHECKING

from ..lazy import F, checkpointing, derived, forward_ad, torch
from ..models.intercept import Rules, patched_blocks
from ..models.loading import LoadedModel
from ..models.memory import MemoryProfile, register_profile
from ..models.probe import repeat_heads
from ..targets import Target
from .backprop import step_gradients
from .base import register
from .gradient import EmbeddingGradientMethod, ScoreFn, baseline_embeds, convergence, span_scores

if TYPE_CHECKING:
    from torch import Tensor as T

NEAR_ZERO = 1e-7  # relative, about one float32 step: x and x0 equal or adjacent -> the gradient
SCALE = "_llmattr_deeplift_scale"  # marks a normaliser's output (rsqrt / reciprocal)
ATTENTION_BLOCK = 2**22  # score elements (batch x heads x rows x keys) per block of the attention multipliers


def _grad_arg(x) -> bool:
    return isinstance(x, torch.Tensor) and x.requires_grad


@dataclass(frozen=True)
class Calls:
    """The torch calls the rules tell apart (read on first use: they are torch's objects)."""

    unary: frozenset
    elementwise: frozenset
    product: frozenset  # element-wise and matrix products
    divide: frozenset
    softmax: frozenset
    normalisers: frozenset


@cache
def calls() -> Calls:
    T = torch.Tensor
    elementwise = frozenset({T.__mul__, T.__rmul__, torch.mul, T.mul})
    return Calls(
        unary=frozenset({F.silu, F.gelu, F.relu, torch.relu, T.relu, torch.tanh, T.tanh, torch.sigmoid, T.sigmoid,
                         F.sigmoid, torch.exp, T.exp, torch.rsqrt, T.rsqrt, torch.sqrt, T.sqrt, torch.pow, T.pow,
                         T.__pow__, torch.reciprocal, T.reciprocal, torch.erf, T.erf}),
        elementwise=elementwise, product=elementwise | {torch.matmul, T.__matmul__, T.matmul, torch.bmm, T.bmm},
        divide=frozenset({T.__truediv__, torch.div, T.div, torch.true_divide}),
        softmax=frozenset({torch.softmax, T.softmax, F.softmax}),
        normalisers=frozenset({torch.rsqrt, T.rsqrt, torch.reciprocal, T.reciprocal}))


def rescale(func, x: T, x0: T, *rest, **kwargs) -> tuple[T, T]:
    """``f(x)`` and the rescale multiplier ``(f(x) - f(x0)) / (x - x0)`` (the derivative ``f'(x)`` where ``x``
    and ``x0`` are equal or adjacent float32 numbers)."""
    y, y0 = func(x, *rest, **kwargs), func(x0, *rest, **kwargs)
    dx = x - x0
    far = dx.abs() > NEAR_ZERO * torch.maximum(x.abs(), x0.abs())
    m = (y - y0) / torch.where(far, dx, 1)
    if not bool(far.all()):
        with forward_ad.dual_level():  # forward mode: no graph, so also exact inside a checkpointed block
            dual = func(forward_ad.make_dual(x, torch.ones_like(x)), *rest, **kwargs)
            m = torch.where(far, m, forward_ad.unpack_dual(dual).tangent)
    return y, m


def _drop(_):
    """Saved-tensor hook of the reference pass: no backward runs through it, so its graph keeps no tensor."""


def _linearised(value: T, inputs: list[T], multipliers: list[T], op) -> T:
    """``value`` whose backward is ``op``-linear in ``inputs`` with the given fixed coefficients."""
    lin = op(inputs, multipliers)
    return value.detach() + (lin - lin.detach())


class DeepLiftModeBody:
    """Records (``reference=None``) or replays the reference operands of every input-dependent
    non-linear call, in call order (both passes run the same code on same-shaped inputs). Replaying consumes
    the list: each call's reference operands are released once its multipliers are computed, so the input
    pass's graph grows as the recorded reference shrinks (the peak stays near one pass's activations)."""

    def __init__(self, reference: list | None = None):
        super().__init__()
        self.recording = reference is None
        self.operands: list = [] if reference is None else reference
        self.calls = 0
        self.paused = False  # inside a block that runs its own rules (:func:`blockwise_attributions`)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs, known = kwargs or {}, calls()
        if self.paused:
            return func(*args, **kwargs)
        if func in known.unary and _grad_arg(args[0]):
            kind = "unary"
        elif func in known.product and _grad_arg(args[0]) and len(args) > 1 and _grad_arg(args[1]):
            kind = "product"
        elif func in known.divide and len(args) > 1 and _grad_arg(args[1]) and not kwargs.get("rounding_mode"):
            kind = "divide"
        elif (func in known.softmax or func is F.layer_norm) and _grad_arg(args[0]):
            kind = "softmax" if func in known.softmax else "layer_norm"
        elif func is F.scaled_dot_product_attention and _grad_arg(args[0]):
            kind = "attention"
        else:
            return func(*args, **kwargs)
        tensors = [a.detach() if isinstance(a, torch.Tensor) else a for a in args]
        if self.recording:
            self.operands.append(tensors)
            return func(*args, **kwargs)
        ref, self.operands[self.calls] = self.operands[self.calls], None  # consumed: freed as the input pass goes
        self.calls += 1
        if any(isinstance(a, torch.Tensor) and isinstance(r, torch.Tensor) and a.shape != r.shape
               for a, r in zip(args, ref, strict=True)):
            raise RuntimeError("deeplift: the reference and input passes took different paths")
        return getattr(self, kind)(func, args, ref, kwargs)

    @staticmethod
    def unary(func, args, ref, kwargs) -> T:
        """Rescale rule: multiplier ``(f(x) - f(x0)) / (x - x0)``, the derivative where they coincide."""
        x = args[0]
        y, m = rescale(func, x.detach(), ref[0], *args[1:], **kwargs)
        out = _linearised(y, [x], [m], lambda i, c: i[0] * c[0])
        if func in calls().normalisers:
            setattr(out, SCALE, True)
        return out

    @staticmethod
    def product(func, args, ref, kwargs) -> T:
        """``a (*) b`` with ``ab - a0 b0 = B (a - a0) + A (b - b0)`` exactly.

        Two input-dependent factors: ``B = (b + b0)/2``, ``A = (a + a0)/2`` (Shapley). An element-wise
        product with a normaliser's scale ``r`` (``x * rsqrt(.)``, softmax's ``e * (1 / sum e)``) is
        anchored, row by row, on the pass with the smaller scale (the larger normaliser):
        ``xr - x0 r0 = r (x - x0) + x0 (r - r0)`` where ``r <= r0``, ``r0 (x - x0) + x (r - r0)`` elsewhere.
        Every coefficient then stays on the scale of the normalised output (softmax: ``<= 1``), so the two
        terms never cancel in float32: the other orientation multiplies by the large scale of a small
        row (``rsqrt(eps)`` of an all-zero reference row; ``1 / sum e`` of the pass whose scores lie far
        below the shared shift), and the terms cancel to a delta orders of magnitude smaller than each.
        """
        a, b = args[0], args[1]
        scaled = func in calls().elementwise and (getattr(b, SCALE, False) or getattr(a, SCALE, False))
        if scaled and getattr(b, SCALE, False):
            anchor = b.detach() <= ref[1]
            coef_b, coef_a = torch.where(anchor, b.detach(), ref[1]), torch.where(anchor, ref[0], a.detach())
        elif scaled:
            anchor = a.detach() <= ref[0]
            coef_b, coef_a = torch.where(anchor, ref[1], b.detach()), torch.where(anchor, a.detach(), ref[0])
        else:
            coef_b, coef_a = (b.detach() + ref[1]) / 2, (a.detach() + ref[0]) / 2
        return _linearised(func(a.detach(), b.detach(), **kwargs), [a, b], [coef_a, coef_b],
                           lambda i, c: func(i[0], c[1], **kwargs) + func(c[0], i[1], **kwargs))

    def divide(self, func, args, ref, kwargs) -> T:
        """``a / b`` = ``a * (1/b)``: rescale on the reciprocal, then the product rule."""
        recip = self.unary(torch.reciprocal, [args[1]], [ref[1]], {})
        a, a0 = args[0], ref[0]
        if not _grad_arg(a):
            return a * recip
        return self.product(torch.mul, [a, recip], [a0, torch.reciprocal(ref[1])], {})

    def softmax(self, func, args, ref, kwargs) -> T:
        """``exp(z - c) / sum exp(z - c)`` with ``c`` shared by both passes (so it carries no delta)."""
        dim = kwargs.get("dim", args[1] if len(args) > 1 else None)
        dtype = kwargs.get("dtype", args[2] if len(args) > 2 and func is not F.softmax else None)
        z, z0 = args[0], ref[0]
        if dtype is not None:
            z, z0 = z.to(dtype), z0.to(dtype)
        c = torch.maximum(z.detach().amax(dim, keepdim=True), z0.amax(dim, keepdim=True))
        c = torch.where(torch.isfinite(c), c, torch.zeros_like(c))
        low = torch.finfo(z.dtype).min  # masked scores may be -inf (a float64 mask cast to float32): exp(low) = 0
        e = self.unary(torch.exp, [(z - c).clamp_min(low)], [(z0 - c).clamp_min(low)], {})
        e0 = torch.exp(z0 - c)
        s, s0 = e.sum(dim, keepdim=True), e0.sum(dim, keepdim=True)
        r = self.unary(torch.reciprocal, [s], [s0], {})
        return self.product(torch.mul, [e, r], [e0, torch.reciprocal(s0)], {})

    @staticmethod
    def attention(func, args, ref, kwargs) -> T:
        """sdpa's ``softmax(q k^T * scale + mask) v`` with the rules above, in :class:`LinearisedAttention`."""
        (q, k, v), (q0, k0, v0) = args[:3], ref[:3]
        scale = kwargs.get("scale") or q.shape[-1] ** -0.5
        return LinearisedAttention.apply(q, k, v, q0, k0, v0, kwargs.get("attn_mask"),
                                         bool(kwargs.get("is_causal")), scale)

    def layer_norm(self, func, args, ref, kwargs) -> T:
        """``(x - mean) * rsqrt(var + eps) * w + b`` with the rescale and product rules."""
        x, x0 = args[0], ref[0]
        shape = args[1] if len(args) > 1 else kwargs["normalized_shape"]
        weight = args[2] if len(args) > 2 else kwargs.get("weight")
        bias = args[3] if len(args) > 3 else kwargs.get("bias")
        eps = args[4] if len(args) > 4 else kwargs.get("eps", 1e-5)
        dims = tuple(range(-len(shape), 0))
        xc, xc0 = x - x.mean(dims, keepdim=True), x0 - x0.mean(dims, keepdim=True)
        sq = self.unary(torch.square, [xc], [xc0], {})
        var, var0 = sq.mean(dims, keepdim=True) + eps, xc0.square().mean(dims, keepdim=True) + eps
        r = self.unary(torch.rsqrt, [var], [var0], {})
        y = self.product(torch.mul, [xc, r], [xc0, torch.rsqrt(var0)], {})
        y = y * weight if weight is not None else y
        return y + bias if bias is not None else y


DeepLiftMode = derived("DeepLiftMode", DeepLiftModeBody, lambda: torch.overrides.TorchFunctionMode)


def visible_block(mask: T | None, is_causal: bool, rows: slice, n_keys: int, device) -> T | None:
    """sdpa's mask for the query rows ``rows``: boolean (True = attend) or additive, broadcastable to
    ``(B, H, R, S)``; ``None`` when every key is visible."""
    if mask is not None:
        return mask[..., rows, :]
    if not is_causal:
        return None
    queries = torch.arange(rows.start, rows.stop, device=device)
    return torch.arange(n_keys, device=device)[None, :] <= queries[:, None]  # top-left causal, as sdpa's


def attention_multipliers_vjp(grad: T, q: T, k: T, v: T, q0: T, k0: T, v0: T, mask: T | None,
                              is_causal: bool, scale: float) -> tuple[T, T, T]:
    """Vector-Jacobian product of DeepLIFT's linearisation of ``o = softmax(z) v``, ``z = q k^T * scale + mask``,
    computed for ``ATTENTION_BLOCK`` score elements at a time (query rows in blocks): no ``(S, S)`` tensor
    outlives its block.

    The rules of :class:`DeepLiftMode` (the eager path's decomposition), per block of rows:
    ``dz = (dq K^T + Q dk^T) scale`` with ``K = (k + k0)/2``, ``Q = (q + q0)/2``; ``e = exp(z - c)`` (``c`` the
    row maximum of both passes) with the rescale multiplier ``m_e``; ``s = sum e``; ``r = 1/s`` with ``m_r``;
    ``p = e r`` anchored on the smaller scale (``dp = R de + E dr`` with ``(R, E) = (r, e0)`` where ``r <= r0``,
    ``(r0, e)`` elsewhere); ``do = dp V + P dv`` with ``V = (v + v0)/2``, ``P = (p + p0)/2``. Transposed:
    ``g_v = P^T g``, ``g_p = g V^T``, ``g_z = m_e (R g_p + m_r sum_j E g_p)``, ``g_q = g_z K scale``,
    ``g_k = g_z^T Q scale``.
    """
    dtype, k_heads = q.dtype, k.shape[1]
    q, q0, grad = q.float(), q0.float(), grad.float()
    k, v, k0, v0 = (repeat_heads(t.float(), q.shape[1]) for t in (k, v, k0, v0))  # GQA: kv heads repeated
    k_mean, v_mean, q_mean = (k + k0) / 2, (v + v0) / 2, (q + q0) / 2
    batch, heads, n_queries = q.shape[:3]
    n_keys = k.shape[2]
    low = torch.finfo(torch.float32).min
    g_q, g_k, g_v = [], torch.zeros_like(k), torch.zeros_like(v)  # out of place: the T steps' vmap batches grad
    step = max(1, ATTENTION_BLOCK // (batch * heads * n_keys))
    for start in range(0, n_queries, step):
        rows = slice(start, min(start + step, n_queries))
        visible = visible_block(mask, is_causal, rows, n_keys, q.device)
        z = torch.matmul(q[:, :, rows], k.transpose(2, 3)) * scale
        z0 = torch.matmul(q0[:, :, rows], k0.transpose(2, 3)) * scale
        if visible is not None and visible.dtype == torch.bool:
            z, z0 = torch.where(visible, z, low), torch.where(visible, z0, low)
        elif visible is not None:
            z, z0 = z + visible, z0 + visible
        c = torch.maximum(z.amax(-1, keepdim=True), z0.amax(-1, keepdim=True))
        c = torch.where(torch.isfinite(c), c, torch.zeros_like(c))
        e, m_e = rescale(torch.exp, (z - c).clamp_min(low), (z0 - c).clamp_min(low))
        e0 = torch.exp(z0 - c)
        s0 = e0.sum(-1, keepdim=True)
        r, m_r = rescale(torch.reciprocal, e.sum(-1, keepdim=True), s0)
        r0 = torch.reciprocal(s0)
        anchor = r <= r0
        p_mean = (e * r + torch.softmax(z0, -1)) / 2
        # index_select, not a slice: a slice over all rows is an alias, which has no batching rule in the
        # T steps' vmap (grad is batched)
        g = grad.index_select(2, torch.arange(rows.start, rows.stop, device=grad.device))
        g_v = g_v + torch.matmul(p_mean.transpose(2, 3), g)
        g_p = torch.matmul(g, v_mean.transpose(2, 3))
        g_r = (g_p * torch.where(anchor, e0, e)).sum(-1, keepdim=True)
        g_z = (g_p * torch.where(anchor, r, r0) + g_r * m_r) * m_e * scale
        g_q.append(torch.matmul(g_z, k_mean))
        g_k = g_k + torch.matmul(g_z.transpose(2, 3), q_mean[:, :, rows])
    # the repeated heads' gradients summed back onto each key/value head
    g_k, g_v = (t.reshape(batch, k_heads, -1, n_keys, t.shape[-1]).sum(2) for t in (g_k, g_v))
    return torch.cat(g_q, dim=2).to(dtype), g_k.to(dtype), g_v.to(dtype)


class LinearisedAttentionBody:
    """sdpa attention forward (memory-efficient), DeepLIFT multipliers backward (:func:`attention_multipliers_vjp`).

    ``forward(q, k, v, q0, k0, v0, mask, is_causal, scale)``: ``q`` ``(B, H, S, D)``, ``k``, ``v``
    ``(B, H_kv, S, D)`` of the input pass (GQA: ``H_kv`` divides ``H``), ``q0``, ``k0``, ``v0`` of the reference
    pass. Keeps these six ``O(S)`` tensors for the backward pass.
    """

    @staticmethod
    def forward(ctx, q, k, v, q0, k0, v0, mask, is_causal, scale):
        ctx.save_for_backward(q, k, v, q0, k0, v0, mask)
        ctx.is_causal, ctx.scale = is_causal, scale
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=is_causal, scale=scale,
                                              enable_gqa=k.shape[1] != q.shape[1])

    @staticmethod
    def backward(ctx, grad):
        q, k, v, q0, k0, v0, mask = ctx.saved_tensors
        g_q, g_k, g_v = attention_multipliers_vjp(grad, q, k, v, q0, k0, v0, mask, ctx.is_causal, ctx.scale)
        return g_q, g_k, g_v, None, None, None, None, None, None


LinearisedAttention = derived("LinearisedAttention", LinearisedAttentionBody, lambda: torch.autograd.Function)


def deeplift_attributions(f: ScoreFn, x: torch.Tensor, x0: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """DeepLIFT attributions ``(x - x0) * m`` ``(T, *x.shape[1:])`` and ``F(x) - F(x0)`` ``(T,)``.

    ``f`` maps a batch ``(1, ...)`` to ``(1, T)``; one reference forward, one input forward, one backward
    (the T steps' multipliers are batched vector-Jacobian products). Attention runs in sdpa's memory-efficient
    kernel; its multipliers are computed in the backward pass a block of query rows at a time
    (:class:`LinearisedAttention`), so memory grows linearly with the length. Inside
    :func:`llmattr.models.probe.eager_attention` (and for softcapped models) the eager attention's own calls go
    through the rules instead: every layer's ``(S, S)`` probabilities, the same multipliers.
    """
    ref_mode = DeepLiftMode()
    with torch.enable_grad(), Rules(ref_mode), torch.autograd.graph.saved_tensors_hooks(_drop, _drop):
        f0 = f(x0.detach().requires_grad_(True)).detach()  # requires_grad marks the input-dependent calls
    xg = x.detach().requires_grad_(True)
    with torch.enable_grad():
        with Rules(DeepLiftMode(ref_mode.operands)):
            out = f(xg)
        (multipliers,) = step_gradients(out.sum(0), [xg])  # (T, 1, ...)
    return ((x - x0) * multipliers[:, 0]).detach(), (out.detach() - f0)[0]


def blockwise_attributions(f: ScoreFn, x: torch.Tensor, x0: torch.Tensor, model: torch.nn.Module
                           ) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`deeplift_attributions` with every decoder block of ``model`` checkpointed: the same multipliers,
    in memory that holds two hidden states per layer and one block's linearised graph.

    The reference pass keeps each block's input ``h0_l`` (and records only the calls outside the blocks: final
    norm, head, objective). In the input pass each block runs under ``torch.utils.checkpoint``: a function that
    records the block's own reference operands from ``h0_l`` and replays them on the block's input, and that the
    backward pass reruns to rebuild the block's linearised graph when it reaches it. Cost: the blocks' reference
    forward runs three times and their input forward twice (plain DeepLIFT: once each).
    """
    ref_inputs: list[torch.Tensor] = []
    ref_mode = DeepLiftMode()
    with torch.enable_grad(), Rules(ref_mode), torch.autograd.graph.saved_tensors_hooks(_drop, _drop), \
            patched_blocks(model, lambda _, forward: partial(_reference_block, ref_mode, forward, ref_inputs)):
        f0 = f(x0.detach().requires_grad_(True)).detach()
    xg = x.detach().requires_grad_(True)
    mode = DeepLiftMode(ref_mode.operands)
    with torch.enable_grad():
        with Rules(mode), patched_blocks(model, lambda k, forward: partial(
                checkpointing.checkpoint, _linearised_block, mode, forward, ref_inputs[k], use_reentrant=False)):
            out = f(xg)
        (multipliers,) = step_gradients(out.sum(0), [xg])
    return ((x - x0) * multipliers[:, 0]).detach(), (out.detach() - f0)[0]


@contextmanager
def _paused(mode: DeepLiftMode) -> Iterator[None]:
    """The pass-wide ``mode`` passes every call through for the duration (a block runs its own rules)."""
    mode.paused = True
    try:
        yield
    finally:
        mode.paused = False


def _reference_block(mode: DeepLiftModeBody, forward, inputs: list, hidden: T, *args, **kwargs):
    """A block of the reference pass: its input kept, its calls left to :func:`_linearised_block`."""
    inputs.append(hidden.detach())
    with _paused(mode):
        return forward(hidden, *args, **kwargs)


def _linearised_block(mode: DeepLiftModeBody, forward, h0: T, hidden: T, *args, **kwargs):
    """One block of the input pass with its own DeepLIFT rules: the block's reference operands recorded from
    ``h0``, then replayed on ``hidden`` (the pass-wide ``mode`` steps aside meanwhile)."""
    block_ref = DeepLiftMode()
    with _paused(mode):
        with Rules(block_ref), torch.autograd.graph.saved_tensors_hooks(_drop, _drop):
            forward(h0.detach().requires_grad_(True), *args, **kwargs)
        with Rules(DeepLiftMode(block_ref.operands)):
            return forward(hidden, *args, **kwargs)


# DeepLIFT's memory profile (the guard's formulas: llmattr.models.memory). Plain passes: 2.5 backward graphs (the
# reference pass's recorded operands, the input pass's linearised graph and its coefficients): an upper bound,
# SmolLM2 measured 1.37 times the floor's activations at 1k tokens; the attention multipliers are computed
# ATTENTION_BLOCK score elements at a time, no (S, S) tensor. Checkpointed (DeepLift.checkpointing, blockwise
# passes): terms fitted to SmolLM2's measured peaks (1k tokens with 10 and 30 layers, 8k tokens with 30) and rounded
# up: 7 L d per token (the blocks' inputs kept; measured 13.9 KB a token and layer, 6 d), 48 d + 24 f per token (one
# block's linearised graph rebuilt), and about 26 float32 temporaries (104 bytes) per element of one block of
# attention multipliers (0.43 GB); 1.11 GB at 1k tokens and 6.07 GB at 8k against 1.06 and 5.78 GB measured.
MEMORY = register_profile(MemoryProfile("deeplift", copies=Fraction(5, 2), checkpointed=(7, 48, 24), score_bytes=104,
                                        score_block=ATTENTION_BLOCK))


@register
class DeepLift(EmbeddingGradientMethod):
    """DeepLIFT with the rescale rule (Shrikumar et al. 2017) from a zero baseline (see module docs)."""

    name = "deeplift"
    family = "gradient (reference)"
    summary = "DeepLIFT: rescale rule for SiLU/GELU/norms, exact product rule, softmax decomposed; sums to F(x)-F(0)"
    signed = True
    cost = "2 forwards (reference + input) + 1 backward (all steps share them)"
    memory_kind = MEMORY.name
    defaults = {"baseline": "all", "objective": "probability", "reduction": "sum"}

    blockwise = False  # set by :meth:`checkpointing`

    @contextmanager
    def checkpointing(self, lm: LoadedModel, enable: bool) -> Iterator[None]:
        """Checkpointed DeepLIFT (:func:`blockwise_attributions`) for the duration when ``enable``."""
        self.blockwise = enable
        try:
            yield
        finally:
            self.blockwise = False

    def attribute_with_info(self, lm: LoadedModel, target: Target) -> tuple[torch.Tensor, dict]:
        """Span scores and the summation-to-delta check per step (Captum's convergence delta)."""
        x = lm.embed(target.input_ids).detach()
        x0 = baseline_embeds(lm, x, target, self.params["baseline"])
        f = self.score_fn(lm, target)
        if self.blockwise:
            attr, delta = blockwise_attributions(f, x, x0, lm.model)
        else:
            attr, delta = deeplift_attributions(f, x, x0)
        return span_scores(attr, target, self.params["reduction"]), convergence(attr, delta)

    def attribute(self, lm: LoadedModel, target: Target) -> torch.Tensor:
        return self.attribute_with_info(lm, target)[0]


@register
class DeepLiftIxG(EmbeddingGradientMethod):
    """What Captum's ``DeepLift`` returns on a Llama-style model (it has no rule for SiLU, RMSNorm or
    functional softmax): ``(x - x0) * dF/dx(x)``, i.e. Input x Gradient relative to the baseline. Kept to
    reproduce the papers' DeepLIFT column (computed through Inseq/Captum)."""

    name = "deeplift-ixg"
    family = "gradient"
    summary = "DeepLIFT as Captum/Inseq compute it on LLMs: (x - 0) * gradient (the peers' behaviour)"
    signed = True
    cost = "1 forward + 1 backward (all steps share them)"
    defaults = {"baseline": "all", "objective": "probability", "reduction": "sum"}

    def attribute(self, lm: LoadedModel, target: Target) -> torch.Tensor:
        x, grads = self.gradients(lm, target)
        x0 = baseline_embeds(lm, x, target, self.params["baseline"])
        return span_scores((x - x0) * grads[:, 0], target, self.params["reduction"])
