"""Path methods on the input embeddings: Integrated Gradients, IGCG, AIEG (paper 004) and GradientSHAP.

All share :func:`integrate`: the path points ``x0 + alpha_k (x - x0)`` are batch rows, chunked by
``internal_batch_size`` (``"auto"``: from the memory budget, :func:`llmattr.models.memory.path_batch`) so memory
is bounded; each chunk is one forward and one backward whose T
vector-Jacobian products (one per generation step) are batched. The baseline ``x0``
(:func:`~llmattr.methods.gradient.baseline_embeds`) is zero for every input embedding (``baseline="all"``: paper
004's algorithm A.3), for the content span only (``baseline="span"``: template and generated prefix kept) or the
unknown token's embedding (``baseline="unk"``: Inseq's, through which paper 000 ran IG).
"""

from __future__ import annotations

import numpy as np

from ..errors import LlmattrError
from ..lazy import torch
from ..models.forward import PathPrefix, content_key
from ..models.loading import LoadedModel
from ..models.memory import PATH_BUDGET, Shapes, is_oom, path_batch, prefix_cache_pays
from ..models.probe import Probe
from ..scores import pos_norm
from ..targets import Target
from .base import COUNT, COUNT_OR_AUTO, choice, register
from .gradient import (
    EmbeddingGradientMethod,
    ScoreFn,
    baseline_embeds,
    convergence,
    embedding_gradients,
    endpoint_delta,
    head_inputs,
    reduce_tokens,
    span_scores,
    suffix_score_fn,
)

PATH_METHODS = ("riemann_right", "riemann_left", "riemann_middle", "riemann_trapezoid", "gausslegendre")
HEAD_STEPS = 25  # paper 003 app. A, on a sequence head: "for LLaMA2, we reduced the number of steps to 25"


def path_alphas(method: str, n_steps: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Points ``alpha_k`` and weights ``w_k`` of the path integral, as Captum's ``IntegratedGradients`` sets them.

    ``gausslegendre``: the Gauss-Legendre nodes and weights on [-1, 1] mapped to [0, 1],
    ``alpha = (1 + x) / 2``, ``w = w_GL / 2``; the Riemann sums: weights ``1/n`` (``riemann_trapezoid``: halved
    at both ends) at ``alpha`` = ``k/n`` (left, k = 0..n-1), ``(k+1)/n`` (right), ``(k+1/2)/n`` (middle),
    ``k/(n-1)`` (trapezoid), the points taken in float32 as Captum's ``torch.linspace`` makes them.
    """
    n = n_steps
    if method == "gausslegendre":
        x, w = np.polynomial.legendre.leggauss(n)
        return torch.from_numpy(0.5 * (1 + x)), torch.from_numpy(0.5 * w)
    if n < 2:
        raise LlmattrError(f"{method} needs n_steps >= 2")
    start, end = {"riemann_left": (0, 1 - 1 / n), "riemann_right": (1 / n, 1),
                  "riemann_middle": (1 / (2 * n), 1 - 1 / (2 * n)), "riemann_trapezoid": (0, 1)}[method]
    weights = torch.full((n,), 1 / n, dtype=torch.float64)
    if method == "riemann_trapezoid":
        weights[[0, -1]] /= 2
    return torch.linspace(start, end, n).double(), weights


def emphasis_factor(f_now: torch.Tensor, f_prev: torch.Tensor) -> torch.Tensor:
    """Paper 004 eq. 12: ``EF = |F(a) - F(a - 1/N)| / (|F(a)| + |F(a - 1/N)|)``; 0 where both are 0."""
    den = f_now.abs() + f_prev.abs()
    return torch.where(den > 0, (f_now - f_prev).abs() / den.clamp_min(torch.finfo(den.dtype).tiny),
                       torch.zeros_like(den))


def integrate(f: ScoreFn, x: torch.Tensor, x0: torch.Tensor, alphas: torch.Tensor, weights: torch.Tensor,
              batch_size: int, clip: float | None = None, f_start: torch.Tensor | None = None,
              prefix: PathPrefix | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Path integral ``sum_k w_k [EF_k] clip(dF_t/dx (x0 + alpha_k (x - x0)))``: ``(T, S, D)``, and with a
    moving ``prefix`` its share ``sum_k w_k [EF_k] <dF_t/dKV_k, dKV_k>`` ``(T,)`` (else ``None``).

    ``x``, ``x0``: ``(1, S, D)``. ``clip``: clamp each gradient to ``[-clip, clip]`` (IGCG, paper 004
    app. A.2; a prefix's share is that of its unclipped gradients). ``f_start``: ``F`` at the point before
    ``alphas[0]`` ``(1, T)``; when given, each step's gradient is weighted by the emphasis factor of ``F``
    between consecutive points (eq. 12, alg. A.3). ``prefix``: the keys and values of tokens before ``x``
    at each path point (:class:`~..models.forward.PathPrefix`), which ``f(embeds, cache)`` attends to.
    """
    total, share, prev, start = None, None, f_start, 0
    while start < len(alphas):
        rows = slice(start, start + batch_size)
        a = alphas[rows].to(x.device, x.dtype)[:, None, None]
        try:
            scores, grads, *scale_grads = path_gradients(f, x0 + a * (x - x0), prefix, rows)
        except RuntimeError as err:  # out of memory after all (a GPU's allocator): halve the chunk
            if not is_oom(err) or batch_size == 1:
                raise
            batch_size //= 2
            continue
        if clip is not None:
            grads = grads.clamp(-clip, clip)
        w = weights[rows].to(scores)[:, None].expand_as(scores)  # (n, T)
        if f_start is not None:
            w = w * emphasis_factor(scores, torch.cat([prev, scores[:-1]]))
            prev = scores[-1:]
        part = torch.einsum("nt,tnsd->tsd", w.to(grads.dtype), grads)
        total = part if total is None else total + part
        if scale_grads:
            part = torch.einsum("nt,tn->t", w.to(scale_grads[0].dtype), scale_grads[0])
            share = part if share is None else share + part
        start += batch_size
    return total, share


def path_gradients(f: ScoreFn, points: torch.Tensor, prefix: PathPrefix | None, rows: slice) -> tuple:
    """``F``, ``dF/dx`` at the path ``points`` ``(n, S, D)`` and, with a moving ``prefix``, ``dF/ds`` ``(T, n)``
    for the prefix's derivative scale ``s`` (:meth:`~..models.forward.PathPrefix.cache`): one backward."""
    if prefix is None:
        return embedding_gradients(f, points)
    if prefix.tangents is None:
        return embedding_gradients(lambda e: f(e, prefix.cache(rows)), points)
    scale = torch.zeros(len(points), dtype=points.dtype, device=points.device, requires_grad=True)
    return embedding_gradients(lambda e: f(e, prefix.cache(rows, scale)), points, scale)


def path_prefix(lm: LoadedModel, x: torch.Tensor, x0: torch.Tensor, alphas: torch.Tensor) -> PathPrefix | None:
    """The template's :class:`~..models.forward.PathPrefix` for the path ``x0 -> x`` ``(1, P, D)`` at ``alphas``,
    kept on the model (``lm.kept``) for the next call with the same template, baseline and points (the examples of
    one task share them); ``None`` where its keys, values and derivatives would take more than
    ``PATH_BUDGET / 8`` bytes, or its eager attention more than ``PATH_BUDGET`` per point."""
    s, length = Shapes.of(lm), x.shape[1]
    moving = not torch.equal(x, x0)
    rows = len(alphas) if moving else 1
    stored = rows * s.layers * 2 * s.kv_heads * s.head_dim * length * s.element * (2 if moving else 1)
    eager = 4 * s.heads * length * length * s.element
    if stored > PATH_BUDGET // 8 or eager > PATH_BUDGET:
        return None
    return lm.kept.fetch(lm.model, ("path-prefix", content_key(x, x0, alphas)),
                         lambda: PathPrefix.compute(lm, x, x0, alphas, max(1, PATH_BUDGET // eager)))


def endpoints_and_net_attention(f: ScoreFn, x: torch.Tensor, x0: torch.Tensor,
                                positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``F(x0)``, ``F(x)`` ``(1, T)`` and paper 004 eq. 9's NetAttention ``(T, S)``: the attention probability from
    each step's query position to every token of the clean input ``x``, averaged over all layers and heads. One
    no-gradient forward of the two endpoints as batch rows, the probe recording the explained rows' probabilities
    (the probe leaves the forward's values unchanged)."""
    with torch.no_grad(), Probe(record=("probs",), rows=positions) as probe:
        ends = f(torch.cat([x0, x]))
    return ends[:1], ends[1:], probe.stacked("probs")[:, 1].float().mean(dim=(0, 1))


class PathMethod(EmbeddingGradientMethod):
    """IG-style methods: ``(x - x0) * integral``, reduced over the embedding dim."""

    signed = True
    defaults = {"n_steps": 16, "method": "gausslegendre", "internal_batch_size": "auto", "baseline": "all",
                "objective": "probability", "reduction": "sum"}

    rules = {**EmbeddingGradientMethod.rules, "n_steps": COUNT, "internal_batch_size": COUNT_OR_AUTO,
             "method": choice(PATH_METHODS)}

    def inputs(self, lm: LoadedModel, target: Target, prefix: int = 0) -> tuple[ScoreFn, torch.Tensor, torch.Tensor]:
        x = lm.embed(target.input_ids).detach()
        f = self.score_fn(lm, target, prefix)
        return f, x, baseline_embeds(lm, x, target, self.params["baseline"])

    def path(self) -> tuple[torch.Tensor, torch.Tensor]:
        return path_alphas(self.params["method"], self.params["n_steps"])

    def memory_rows(self, lm: LoadedModel, tokens: int) -> int:
        """Path points per chunk: ``internal_batch_size``, or with ``"auto"`` as many as the memory budget
        allows (:func:`llmattr.models.memory.path_batch`)."""
        batch, points = self.params["internal_batch_size"], len(self.path()[0])
        return path_batch(lm, tokens, points) if batch == "auto" else batch

    def clip(self) -> float | None:
        return None

    def gradient_integral(self, lm: LoadedModel, f: ScoreFn, x: torch.Tensor, x0: torch.Tensor) -> torch.Tensor:
        """The weighted path integral of the gradient, ``memory_rows`` path points per chunk."""
        alphas, weights = self.path()
        return integrate(f, x, x0, alphas, weights, self.memory_rows(lm, x.shape[1]), clip=self.clip())[0]

    def attributions(self, lm: LoadedModel, target: Target, prefix: int = 0) -> torch.Tensor:
        """Embedding-level attributions ``(T, S, D)`` for every input token (completeness holds over all).

        ``prefix``: tokens before this index get no backward pass (and zero attribution).
        """
        f, x, x0 = self.inputs(lm, target, prefix)
        return (x - x0) * self.gradient_integral(lm, f, x, x0)

    def attribute_with_info(self, lm: LoadedModel, target: Target) -> tuple[torch.Tensor, dict]:
        """Span scores and Captum's convergence delta per step (:func:`~.gradient.convergence`).

        Completeness sums over every token whose baseline differs from the input, the template's too. The
        template (the tokens before the content span) runs as a :class:`~..models.forward.PathPrefix`: its keys
        and values at each path point, kept for the task's next example, and its share of the sum through them,
        so the backward pass covers only the span and what follows it (:func:`path_prefix`). Where that
        prefix does not pay (long inputs, :func:`~..models.memory.prefix_cache_pays`), every token is in the graph.
        """
        alphas, weights = self.path()
        f, x, x0 = self.inputs(lm, target, target.span[0])
        p, rows = target.span[0], self.memory_rows(lm, x.shape[1])
        prefix = path_prefix(lm, x[:, :p], x0[:, :p], alphas) if prefix_cache_pays(lm, p, x.shape[1]) else None
        if prefix is None:
            f_all = self.score_fn(lm, target)
            grads, share = integrate(f_all, x, x0, alphas, weights, rows, clip=self.clip())
            attr = (x - x0) * grads
        else:
            after = suffix_score_fn(lm, target, self.params["objective"], p, self.explained(lm)[1])
            grads, share = integrate(after, x[:, p:], x0[:, p:], alphas, weights, rows, clip=self.clip(),
                                     prefix=prefix)
            attr = torch.cat([grads.new_zeros(grads.shape[0], p, grads.shape[2]), (x - x0)[:, p:] * grads], 1)
        delta = endpoint_delta(lm, target, *self.explained(lm), f, x, x0)
        return span_scores(attr, target, self.params["reduction"]), convergence(attr, delta, share)

    def attribute(self, lm: LoadedModel, target: Target) -> torch.Tensor:
        return self.attribute_with_info(lm, target)[0]


@register
class IntegratedGradients(PathMethod):
    """Integrated Gradients (Sundararajan et al. 2017; paper 004 eq. 3) from a zero baseline."""

    name = "integrated-gradients"
    family = "gradient (path)"
    summary = "Integrated Gradients: (x - 0) * mean path gradient, n_steps points batched as rows"
    cost = "n_steps forwards + backwards as batch rows (all steps share them)"

    @classmethod
    def head_scores(cls, model: torch.nn.Module, input_ids: torch.Tensor, seed: int = 0) -> torch.Tensor:
        """Paper 003's IG of a sequence head: zero baseline, :data:`HEAD_STEPS` Gauss-Legendre points, each token's
        ``x_i * integral of dF/dx_i`` reduced by the l1 norm."""
        x, f = head_inputs(model, input_ids)
        alphas, weights = path_alphas("gausslegendre", HEAD_STEPS)
        total, _ = integrate(f, x, torch.zeros_like(x), alphas, weights, batch_size=HEAD_STEPS)
        return reduce_tokens((total[0] * x[0]).float(), "l1").double()


@register
class IGCG(PathMethod):
    """IG with clipped gradients (paper 004 app. A.2): each path gradient clamped to [-threshold, threshold]."""

    name = "igcg"
    family = "gradient (path)"
    summary = "IGCG: Integrated Gradients with every path gradient clipped at +-threshold (paper 004 A.2)"
    cost = "n_steps forwards + backwards as batch rows (all steps share them)"
    defaults = {**PathMethod.defaults, "threshold": 1e6}

    rules = {**PathMethod.rules, "threshold": ("above", (0, None), "igcg threshold must be positive")}

    def clip(self) -> float | None:
        return float(self.params["threshold"])


@register
class AIEG(PathMethod):
    """Attended Integrated and Emphasized Gradients (paper 004 eqs. 9-13, algorithm A.3).

    ``AIEG_t = NetAttention_t x PosNorm(sum_D (x - x0) * (1/N) sum_k EF_k dF/dx(alpha_k))`` with
    ``alpha_k = k/N`` (k = 1..N) and ``EF_k`` between ``alpha_k`` and ``alpha_{k-1}`` (``F(alpha_0)`` =
    ``F(x0)``). PosNorm runs over every token the step sees; the content span is kept afterwards.
    """

    name = "aieg"
    family = "gradient (path) x attention"
    summary = "AIEG: emphasis-weighted IG, PosNorm, times attention averaged over layers and heads (paper 004)"
    signed = False
    cost = "n_steps forwards + backwards as batch rows, 1 forward of the two endpoints (recording attention)"
    defaults = {"n_steps": 16, "internal_batch_size": "auto", "baseline": "all", "objective": "probability"}

    def path(self) -> tuple[torch.Tensor, torch.Tensor]:
        n = self.params["n_steps"]
        alphas = torch.arange(1, n + 1, dtype=torch.float64) / n
        return alphas, torch.full((n,), 1.0 / n, dtype=torch.float64)

    def attribute_with_info(self, lm: LoadedModel, target: Target) -> tuple[torch.Tensor, dict]:
        """Scores and the convergence delta of the emphasis-weighted integral before PosNorm and NetAttention."""
        f, x, x0 = self.inputs(lm, target)
        alphas, weights = self.path()
        f_start, f_end, net = endpoints_and_net_attention(f, x, x0, target.positions.to(lm.device))
        grads = integrate(f, x, x0, alphas, weights, self.memory_rows(lm, x.shape[1]), f_start=f_start)[0]
        attr = (x - x0) * grads
        ig = reduce_tokens(attr.float(), "sum")  # (T, S)
        scores = pos_norm(ig) * net
        a, b = target.span
        return scores[:, a:b].detach(), convergence(attr, (f_end - f_start)[0])


@register
class GradientShap(PathMethod):
    """GradientSHAP (Lundberg & Lee 2017, Captum's estimator) with the zero baseline: the mean over
    ``n_samples`` points ``alpha ~ U(0, 1)`` (seeded) of ``(x - x0) * dF/dx(x0 + alpha (x - x0))``."""

    name = "gradient-shap"
    family = "gradient (path, sampled)"
    summary = "GradientSHAP: (x - 0) * gradient at n_samples random points of the path (seeded)"
    cost = "n_samples forwards + backwards as batch rows (all steps share them)"
    defaults = {"n_samples": 5, "seed": 0, "internal_batch_size": "auto", "baseline": "all",
                "objective": "probability", "reduction": "sum"}

    rules = {**PathMethod.rules, "n_samples": COUNT}

    def path(self) -> tuple[torch.Tensor, torch.Tensor]:
        n = self.params["n_samples"]
        gen = torch.Generator().manual_seed(int(self.params["seed"]))
        return torch.rand(n, generator=gen, dtype=torch.float64), torch.full((n,), 1.0 / n, dtype=torch.float64)
