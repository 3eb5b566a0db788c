"""Source-level estimators: attribution methods whose unit is a source (a document, a sentence), not a token.

Each is a registered :class:`~llmattr.methods.AttributionMethod` with ``granularity = "source"``: it needs a
prompt with sources (``llmattr explain --document ...``, ``llmattr.explain(q, documents=[...])``; without them one
line) and computes :meth:`SourceMethod.scores` ``(rows, n_sources)``, column ``i`` for ``target.prompt.sources``
source ``i``. ``rows`` is ``n_steps`` (one row per explained token) for leave-one-out and the hierarchy;
ContextCite explains the whole answer, one row (``answer_level = True``), as the package does. Its
:meth:`~SourceMethod.attribute` gives the token scores every view and metric reads: each source's value spread
evenly over its tokens (:func:`~llmattr.methods.base.spread`; 0 on the tokens of no source; ContextCite's row on
every step), so :meth:`llmattr.explanation.Explanation.source_scores` gives the values back (to float rounding)
and the token heatmap shows a source's value per token.

* ``leave-one-out`` (AttriBoT's exact LOO, ContextCite's LOO baseline): ``s_i = F_t(x) - F_t(x without source
  i)``, the objective's drop when source ``i``'s tokens are deleted (default objective ``log-prob``: the
  log-probability drop). ``prefix="cached"`` reuses the clean keys and values before each removed source
  (:mod:`.source_ablation`), ``"none"`` recomputes every token (``batch_size=1``: the naive reference).
* ``contextcite`` (Cohen-Wang et al. 2024): :func:`contextcite_masks` random keep masks (the package's seeds,
  ``num_ablations=64``, ``ablation_keep_prob=0.5``), the response ``logit P(answer | ablated context)``
  (:func:`logit_response`) and the package's surrogate: LASSO (alpha 0.01) on standardised masks
  (:func:`lasso_surrogate`), weights in the response's units.
* ``attribot-hierarchical`` (AttriBoT, Liu et al. ICLR 2025, sec. 3.2): leave-one-out over the documents
  (``sources.documents``), then over the sentences of the ``top_documents`` documents with the largest drop
  only; a sentence of another document scores 0 (not searched). Exact LOO on the searched sentences, an
  approximation elsewhere: it assumes a document whose removal barely moves the objective holds no sentence
  that does (a sentence whose effect its document's other sentences cancel is missed). Forward passes:
  ``n_documents + sum of the top documents' sentences`` instead of ``n_sentences``.
"""

from __future__ import annotations

from typing import ClassVar

from .. import objectives
from ..errors import LlmattrError
from ..lazy import torch
from ..models.loading import LoadedModel
from ..targets import Target
from .base import WHOLE, WHOLE_OR_AUTO, AttributionMethod, choice, register, source_features, spread
from .source_ablation import (
    AUTO,
    Ablation,
    ablated_objective,
    clean_pass,
    contextcite_masks,
    logit_response,
    prompt_sources,
    rows_per_pass,
)

PREFIX_MODES = ("cached", "none")


class SourceMethod(AttributionMethod):
    """A method scoring sources: :meth:`attribute` gives ``(rows, n_sources)`` (module docstring)."""

    granularity: ClassVar[str] = "source"
    answer_level: ClassVar[bool] = False  # one row for the whole answer instead of one per step
    needs_gradients = False
    signed = True
    family = "perturbation"
    memory_kind = "forward"

    rules = {"batch_size": WHOLE_OR_AUTO, "num_ablations": WHOLE, "top_documents": WHOLE,
             "prefix": choice(PREFIX_MODES, f"{{name}} prefix must be one of {', '.join(PREFIX_MODES)}")}

    def memory_rows(self, lm: LoadedModel, tokens: int) -> int:
        return rows_per_pass(lm, self.params["batch_size"], tokens)

    def ablation(self, lm: LoadedModel, target: Target, groups) -> Ablation:
        return Ablation.of(target, groups, *self.explained(lm))

    def scores(self, lm: LoadedModel, target: Target) -> torch.Tensor:
        raise NotImplementedError

    def attribute(self, lm: LoadedModel, target: Target) -> torch.Tensor:
        """``(n_steps, n_span)``: :meth:`scores` spread over each source's tokens (module docstring)."""
        prompt_sources(target, f"method {self.name}")
        values = self.scores(lm, target).float().cpu()
        rows = values.expand(target.n_steps, -1) if self.answer_level else values
        return spread(rows, source_features(target))


def leave_one_out(lm: LoadedModel, ablation: Ablation, batch_size: int | str, reuse_prefix: bool) -> torch.Tensor:
    """``(T, n)`` ``F_t(x) - F_t(x without source i)``: one ablated row per source."""
    n = len(ablation.groups)
    clean = clean_pass(lm, ablation) if reuse_prefix else None
    keep = ~torch.eye(n, dtype=torch.bool)
    dropped = ablated_objective(lm, ablation, keep, batch_size, reuse_prefix, clean)
    full = clean[0] if clean else ablated_objective(lm, ablation, torch.ones(1, n, dtype=torch.bool), 1, False)[0]
    return (full[None] - dropped).T


@register
class LeaveOneOut(SourceMethod):
    """Leave-one-out over sources: the objective's drop when one source is deleted."""

    name = "leave-one-out"
    summary = "leave-one-out over sources: the log-probability drop when a source is deleted (prefix cache)"
    cost = "1 clean forward + n_sources rows, each from its source's start (batch_size rows per pass)"
    defaults = {"batch_size": AUTO, "prefix": "cached"}
    objective = "log-prob"

    def scores(self, lm: LoadedModel, target: Target) -> torch.Tensor:
        ablation = self.ablation(lm, target, target.prompt.sources.groups)
        return leave_one_out(lm, ablation, self.params["batch_size"], self.params["prefix"] == "cached")


@register
class HierarchicalLeaveOneOut(SourceMethod):
    """AttriBoT's hierarchical search: documents first, then the sentences of the top documents."""

    name = "attribot-hierarchical"
    summary = "AttriBoT hierarchy: leave-one-out over documents, then over the top documents' sentences only"
    cost = "n_documents + the top documents' sentences rows (prefix cache, batch_size rows per pass)"
    defaults = {"batch_size": AUTO, "prefix": "cached", "top_documents": 2}
    objective = "log-prob"

    def scores(self, lm: LoadedModel, target: Target) -> torch.Tensor:
        sources = target.prompt.sources
        if sources.documents is None or sources.parents is None:
            raise LlmattrError(f"method {self.name} needs sentence sources inside documents (sources with "
                               "documents and parents)")
        return hierarchical(lm, self.ablation(lm, target, sources.documents.groups), sources.groups,
                            sources.parents, self.params["top_documents"], self.params["batch_size"],
                            self.params["prefix"] == "cached")


def hierarchical(lm: LoadedModel, documents: Ablation, sentences: tuple[tuple[int, ...], ...],
                 parents: tuple[int, ...], top: int, batch_size: int | str, reuse_prefix: bool) -> torch.Tensor:
    """``(T, n_sentences)``: LOO of the sentences of the ``top`` documents with the largest drop (summed over the
    steps), 0 elsewhere; the documents' LOO ``(T, n_documents)`` picks them."""
    chosen = leave_one_out(lm, documents, batch_size, reuse_prefix).sum(0).argsort(descending=True)[:top]
    searched = [i for i, parent in enumerate(parents) if parent in set(chosen.tolist())]
    out = torch.zeros(documents.steps, len(sentences))
    if searched:
        inner = Ablation(documents.ids, tuple(sentences[i] for i in searched), documents.target_ids,
                         documents.explained, documents.foil)
        out[:, searched] = leave_one_out(lm, inner, batch_size, reuse_prefix)
    return out


def lasso(x: torch.Tensor, y: torch.Tensor, alpha: float, tol: float = 1e-12, max_iter: int = 100_000) -> torch.Tensor:
    """``argmin_w 1/(2n) ||y - x w||^2 + alpha ||w||_1`` for centred ``x`` ``(n, p)`` and ``y`` ``(n,)`` (scikit-learn's
    ``Lasso`` objective), by cyclic coordinate descent (Friedman et al. 2010) until the duality gap is below
    ``tol * ||y||^2``."""
    n, p = x.shape
    penalty = alpha * n
    w = torch.zeros(p, dtype=x.dtype)
    residual = y.clone()
    norms = (x * x).sum(0)
    bound = tol * float(y @ y)
    for _ in range(max_iter):
        for j in range(p):
            if norms[j] == 0:
                continue
            rho = x[:, j] @ residual + w[j] * norms[j]
            new = torch.sign(rho) * torch.clamp(rho.abs() - penalty, min=0) / norms[j]
            residual += (w[j] - new) * x[:, j]
            w[j] = new
        if duality_gap(x, y, w, residual, penalty) <= bound:
            return w
    raise LlmattrError(f"the LASSO surrogate did not converge in {max_iter} sweeps")


def duality_gap(x: torch.Tensor, y: torch.Tensor, w: torch.Tensor, residual: torch.Tensor, penalty: float) -> float:
    """The LASSO duality gap ``P(w) - D(v)`` with the scaled residual as dual point (scikit-learn's ``gap_enet``)."""
    dual_norm = float((x.T @ residual).abs().max())
    scale = min(1.0, penalty / dual_norm) if dual_norm > 0 else 1.0
    r2 = float(residual @ residual)
    return 0.5 * r2 * (1 + scale ** 2) + penalty * float(w.abs().sum()) - scale * float(residual @ y)


def lasso_surrogate(masks: torch.Tensor, response: torch.Tensor, n_tokens: int,
                    alpha: float = 0.01) -> tuple[torch.Tensor, float]:
    """ContextCite's surrogate ``response ~ w . mask + b`` as the package fits it (``LassoRegression``): masks
    standardised (population std, 1 where a column is constant), the response divided by the answer's token
    count ``n_tokens``, LASSO with an intercept, weights mapped back to the unstandardised masks and multiplied
    by ``n_tokens``. Returns ``(w (n_sources,), b)``."""
    x = masks.double()
    y = response.double() / n_tokens
    mean, std = x.mean(0), x.std(0, correction=0)
    scale = torch.where(std == 0, torch.ones_like(std), std)
    z = (x - mean) / scale
    z = z - z.mean(0)
    coef = lasso(z, y - y.mean(), alpha)
    weight = coef / scale
    bias = float(y.mean() - (mean / scale) @ coef)
    return weight * n_tokens, bias * n_tokens


@register
class ContextCite(SourceMethod):
    """ContextCite: a sparse linear surrogate of the answer's logit-probability on random source ablations."""

    name = "contextcite"
    summary = "ContextCite: LASSO surrogate of logit P(answer) on 64 random source keep/drop masks"
    cost = "1 clean forward + num_ablations rows (prefix cache, batch_size rows per pass)"
    defaults = {"num_ablations": 64, "ablation_keep_prob": 0.5, "lasso_alpha": 0.01, "batch_size": AUTO,
                "seed": 0, "prefix": "cached"}
    answer_level = True

    rules = {**SourceMethod.rules,
             "ablation_keep_prob": ("between", (0, 1), "contextcite ablation_keep_prob must be in (0, 1)"),
             "lasso_alpha": ("above", (0, None), "contextcite lasso_alpha must be > 0")}

    def masks(self, n_sources: int) -> torch.Tensor:
        p = self.params
        return contextcite_masks(n_sources, p["num_ablations"], float(p["ablation_keep_prob"]), int(p["seed"]))

    def scores(self, lm: LoadedModel, target: Target) -> torch.Tensor:
        return self.fit(lm, target)[0][None].float()

    def fit(self, lm: LoadedModel, target: Target) -> tuple[torch.Tensor, float]:
        """The surrogate's ``(w, b)`` on this target's ablations (module docstring)."""
        sources = target.prompt.sources
        ablation = Ablation.of(target, sources.groups, objectives.OBJECTIVES["log-prob"])
        masks = self.masks(len(sources))
        log_probs = ablated_objective(lm, ablation, masks, self.params["batch_size"],
                                      self.params["prefix"] == "cached")
        return lasso_surrogate(masks, logit_response(log_probs), target.n_steps, float(self.params["lasso_alpha"]))

