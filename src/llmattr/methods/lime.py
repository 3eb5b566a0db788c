"""LIME (Ribeiro et al., 2016) through Captum's ``Lime``, over a token-mask function of our own.

Interpretable features are the content tokens, or, where the prompt has sources (documents, sentences, spans:
docs/sources.md), the sources: a perturbation then keeps or removes whole sources, the tokens of no source (the
question, the template words between documents) stay as they are, and each source's coefficient is spread evenly
over its tokens (:func:`~llmattr.methods.base.spread`). A perturbation keeps each with probability 1/2 (Captum's
default sampler) and replaces a removed token's input embedding by the zero baseline (template tokens
stay intact). Samples are weighted by Captum's default exponential kernel on the cosine distance of
the embeddings, and the explained output is the target token's probability (Inseq's default, which
paper 000 used) or the one its ``objective`` parameter picks (:mod:`llmattr.objectives`; ``contrast`` with a ``foil``:
``logit(y_t) - logit(foil)``). The interpretable model is a weighted ridge regression (the ``lime`` package's
default, Ridge(alpha=1)) solved in closed form, so no scikit-learn is needed.

Batched: ``batch_size`` perturbations per forward, after a template prefix cached once; a forward returns
every step's probability, and the steps reuse the same perturbations (the sampler is reseeded per step),
so the forwards run once.
"""

from __future__ import annotations

from .. import objectives
from ..lazy import lazy, torch
from ..models.forward import SharedPrefix
from ..models.loading import LoadedModel
from ..targets import Target
from .base import COUNT, AttributionMethod, register, source_features, spread

captum_attr = lazy("captum.attr")


class WeightedRidge:
    """Captum interpretable model: argmin_b sum_s w_s (y_s - b0 - z_s . b)^2 + alpha ||b||^2, closed form.

    It implements the interface ``Lime`` calls (``fit`` on a loader of ``(z, y, w)`` batches, then
    ``representation``), so it needs no Captum base class.
    """

    def __init__(self, alpha: float = 1.0):
        self.alpha = alpha
        self.coef: torch.Tensor | None = None

    def fit(self, train_data, **kwargs) -> dict:
        z, y, w = (torch.cat(parts).double() for parts in zip(*train_data, strict=True))
        x = torch.cat([z.reshape(len(z), -1), torch.ones(len(z), 1, dtype=z.dtype, device=z.device)], dim=1)
        penalty = torch.full((x.shape[1],), float(self.alpha), dtype=x.dtype, device=x.device)
        penalty[-1] = 0.0  # the intercept is not penalised
        gram = x.T @ (w.reshape(-1, 1) * x) + torch.diag(penalty)
        beta = torch.linalg.lstsq(gram, x.T @ (w.reshape(-1) * y.reshape(-1))).solution
        self.coef = beta[:-1].float()[None]
        return {}

    def representation(self) -> torch.Tensor:
        return self.coef

    def __call__(self, z: torch.Tensor) -> torch.Tensor:
        return z.reshape(len(z), -1).float() @ self.coef.T


def span_forward(lm: LoadedModel, target: Target,
                 explained: objectives.Objective = objectives.OBJECTIVES["probability"],
                 foil: torch.Tensor | None = None):
    """f(content embeddings (B, n, d)) -> ``explained`` (the target probability) of every step (B, T); the
    rest stays fixed.

    The template before the span is run once into a shared key/value cache; each forward runs only the
    span and what follows it.
    """
    a, b = target.span
    with torch.no_grad():
        suffix = lm.embed(target.input_ids[:, b:])
    prefix = SharedPrefix.compute(lm, target.input_ids, a)
    positions = target.positions.to(lm.device)

    def forward(span_embeds: torch.Tensor) -> torch.Tensor:
        rows = span_embeds.shape[0]
        full = torch.cat([span_embeds.to(suffix.dtype), suffix.expand(rows, -1, -1)], 1)
        with torch.no_grad():
            logits = prefix.logits_at(lm, full, positions).float()  # (B, T, V)
        return explained(logits, target.target_ids, foil)

    return forward


class SharedSteps:
    """Serve step t's column of a multi-step forward, reusing outputs for inputs seen at the same call."""

    def __init__(self, forward):
        self.forward = forward
        self.cache: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.step = 0
        self.calls = 0

    def at_step(self, step: int) -> SharedSteps:
        self.step, self.calls = step, 0
        return self

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        k, self.calls = self.calls, self.calls + 1
        if k >= len(self.cache) or not torch.equal(self.cache[k][0], x):
            self.cache[k:k + 1] = [(x.detach().clone(), self.forward(x))]
        return self.cache[k][1][:, self.step]


def lime_step(forward, span_embeds: torch.Tensor, n_samples: int, batch_size: int, alpha: float,
              seed: int, owner: torch.Tensor | None = None) -> torch.Tensor:
    """Captum ``Lime`` on ``forward`` (B, n, d) -> (B,) with one feature per token: ``(n,)`` coefficients; or,
    with ``owner`` (the source of each token, -1 for none), one feature per source: ``(k,)`` coefficients.

    The tokens of no source form one more feature whose baseline is their own embedding, so removing it changes
    nothing (its coefficient is dropped)."""
    n, d = span_embeds.shape[1:]
    features = torch.arange(n) if owner is None else torch.where(owner >= 0, owner, int(owner.max()) + 1)
    mask = features.to(span_embeds.device)[None, :, None].expand(1, n, d)
    baselines = 0.0 if owner is None else torch.where((owner >= 0).to(span_embeds.device)[None, :, None],
                                                      torch.zeros_like(span_embeds), span_embeds)
    lime = captum_attr.Lime(forward, interpretable_model=WeightedRidge(alpha))
    gpu = [span_embeds.device] if span_embeds.device.type == "cuda" else []
    with torch.random.fork_rng(devices=gpu):  # the seed leaves the caller's generators (CPU and GPU) as they were
        torch.manual_seed(seed)
        coef = lime.attribute(span_embeds, baselines=baselines, feature_mask=mask, n_samples=n_samples,
                              perturbations_per_eval=batch_size, return_input_shape=False)
    coef = coef.reshape(-1).cpu()
    return coef if owner is None else coef[: int(owner.max()) + 1]


@register
class LimeMethod(AttributionMethod):
    """LIME over the content tokens (Captum), token removal = zero embedding."""

    name = "lime"
    family = "perturbation"
    summary = "LIME (Captum): weighted ridge on random token keep/zero masks, target probability"
    needs_gradients = False
    signed = True
    cost = "n_samples rows after a cached template prefix (batch_size per pass; all steps share them)"
    defaults = {"n_samples": 50, "batch_size": 16, "alpha": 1.0, "seed": 0}
    rules = {"n_samples": COUNT, "batch_size": COUNT, "alpha": ("at-least", (0, None), "lime alpha must be >= 0")}
    objective = "probability"

    def memory_rows(self, lm: LoadedModel, tokens: int) -> int:
        return self.params["batch_size"]


    def attribute(self, lm: LoadedModel, target: Target) -> torch.Tensor:
        a, b = target.span
        with torch.no_grad():
            span_embeds = lm.embed(target.input_ids)[:, a:b]
        shared = SharedSteps(span_forward(lm, target, *self.explained(lm)))
        p = self.params
        owner = source_features(target)
        rows = torch.stack([lime_step(shared.at_step(t), span_embeds, p["n_samples"], p["batch_size"],
                                      float(p["alpha"]), int(p["seed"]), owner) for t in range(target.n_steps)])
        return rows if owner is None else spread(rows, owner)
