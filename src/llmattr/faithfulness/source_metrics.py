"""Faithfulness at source granularity (issue 34 point 4): the unit removed, kept or masked is a whole source (a
document, a sentence), each source's tokens together.

A method's source scores ``S`` ``(rows, n)`` (rows = explained steps, or one row for an answer-level method such as
ContextCite) read as one score per source ``s_i = sum_rows S[r, i]`` for the rankings below (leave-one-out of
``log P(y) = sum_t log p(y_t)`` is exactly the sum of its per-step drops). ``F(x) = log P(y | x)``; removing
sources deletes their tokens (:mod:`llmattr.methods.source_ablation`, ContextCite's convention); ``top(k)`` are the k
sources of largest ``s_i`` (ties in source order).

* top-k source removal (ContextCite sec. 4): ``drop_k = F(x) - F(x without top(k))``, k = 1..K (``source_top_k``),
  and their mean;
* comprehensiveness / sufficiency over sources (DeYoung et al. 2020, ERASER, at source level):
  ``comp = mean_k [P(y|x) - P(y|x without top(k))]``, ``suff = mean_k [P(y|x) - P(y|top(k) only)]``;
* the linear datamodeling score (LDS, Park et al. 2023; ContextCite sec. 4): Spearman's rho between the
  attribution's prediction ``sum_i s_i m_i`` and the actual ``logit P(y | x_m)`` over ``lds_ablations`` held-out
  random keep masks ``m`` (ContextCite's draw, keep probability 1/2, seeds disjoint from its training masks);
* alignment with the gold sources (where the task knows them): average precision of the ranking
  (:func:`llmattr.faithfulness.alignment.average_precision`) and the top-1 hit (``top(1)`` is gold);
* pi-Soft-NC/NS with the Bernoulli masks over sources (paper 000 eq. 7, the same estimator as token-level
  pi-Soft, :func:`llmattr.faithfulness.soft.evaluate_target` with ``groups``): retain probabilities per source
  from the raw source scores (:func:`llmattr.scores.retain_probs`), a source's tokens zeroed together, tokens of
  no source never perturbed; an answer-level row serves every step.

Every value is stored per example as a :class:`~llmattr.store.Row`; the report gives them CIs and paired tests
against the random control as it does the token-level metrics.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from .. import objectives
from ..declarations import RETAIN_RULE, MetricRow, TableSpec
from ..errors import LlmattrError
from ..explanation import Explanation
from ..lazy import lazy, torch
from ..methods.source_ablation import AUTO, Ablation, ablated_objective, clean_pass, contextcite_masks, logit_response
from ..models.loading import LoadedModel
from ..scores import retain_probs
from ..sources.spans import Sources
from ..store import Row
from ..targets import Target
from .alignment import average_precision
from .inputs import check_explanation, check_tokenizer, evaluated_steps, example_key, target_from_explanation
from .registry import Metric, MetricContext, Option, register
from .soft import SOFT_OPTIONS, evaluate_target, soft_options

sps = lazy("scipy.stats")

TOP_K = Option("source_top_k", 5, "Source-level metrics: top-k source removal for k = 1..K", positive=True)
LDS_ABLATIONS = Option("lds_ablations", 32, "Held-out random source ablations of the LDS", positive=True)
HELD_OUT_SEED = 1_000_000  # the LDS masks' seeds start here: ContextCite's training masks use seeds 0..63


@dataclass(frozen=True)
class SourceInput:
    """What the source-level metrics read: the target (its prompt carries the sources), the raw source scores
    ``(rows, n_sources)`` and whether they are signed."""

    target: Target
    scores: torch.Tensor
    signed: bool

    @property
    def sources(self) -> Sources:
        return self.target.prompt.sources

    @property
    def answer_scores(self) -> torch.Tensor:
        """``s_i = sum_rows S[r, i]`` ``(n,)``."""
        return self.scores.double().sum(0)


def source_input(explanation: Explanation) -> SourceInput:
    """The :class:`SourceInput` of an Explanation that carries sources (``explanation.sources``) and per-source
    raw scores (``explanation.source_scores()``, ``(rows, n_sources)``); one line otherwise."""
    sources = getattr(explanation, "sources", None)
    if sources is None or not len(sources):
        raise LlmattrError("the source-level metrics need an explanation with sources (documents or sentences)")
    target = target_from_explanation(explanation)
    target = replace(target, prompt=replace(target.prompt, sources=sources))
    return SourceInput(target, torch.as_tensor(explanation.source_scores(), dtype=torch.float64),
                       explanation.signed)


def top_order(scores: torch.Tensor) -> torch.Tensor:
    """Source indices by descending score, ties in source order."""
    return torch.sort(-scores, stable=True).indices


def removal_masks(order: torch.Tensor, k_max: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Keep masks ``(K, n)``: without ``top(k)`` (comprehensiveness, top-k removal) and with ``top(k)`` only
    (sufficiency), k = 1..K."""
    n = len(order)
    rank = torch.empty(n, dtype=torch.long)
    rank[order] = torch.arange(n)
    k = torch.arange(1, k_max + 1)[:, None]
    top = rank[None] < k
    return ~top, top


def spearman(a: torch.Tensor, b: torch.Tensor) -> float:
    """Spearman's rho (``scipy.stats.spearmanr``: Pearson's correlation of the average ranks); NaN where either
    side is constant."""
    a, b = a.detach().double().cpu().numpy(), b.detach().double().cpu().numpy()
    if np.ptp(a) == 0 or np.ptp(b) == 0:
        return float("nan")
    return float(sps.spearmanr(a, b).statistic)


@dataclass(frozen=True)
class RemovalResult:
    """The removal metrics of one explanation (module docstring)."""

    top_k_drop: list[float]
    comprehensiveness: float
    sufficiency: float
    lds: float

    def rows(self) -> list[Row]:
        return [*(Row("source_top_k_drop", v, x=k + 1) for k, v in enumerate(self.top_k_drop)),
                Row("source_top_k_drop_mean", sum(self.top_k_drop) / len(self.top_k_drop)),
                Row("source_comprehensiveness", self.comprehensiveness), Row("source_sufficiency", self.sufficiency),
                Row("source_lds", self.lds)]


def removal_metrics(lm: LoadedModel, given: SourceInput, k_max: int = TOP_K.default,
                    lds_ablations: int = LDS_ABLATIONS.default, seed: int = 0,
                    batch_size: int | str = AUTO) -> RemovalResult:
    """Top-k removal, comprehensiveness, sufficiency and the LDS of ``given`` (module docstring): every ablated
    input in one :func:`~llmattr.methods.source_ablation.ablated_objective` call (prefix cache)."""
    s = given.answer_scores
    n = len(s)
    k_max = min(k_max, n)
    without, only = removal_masks(top_order(s), k_max)
    held_out = contextcite_masks(n, lds_ablations, 0.5, HELD_OUT_SEED + seed)
    ablation = Ablation.of(given.target, given.sources.groups, objectives.OBJECTIVES["log-prob"])
    clean = clean_pass(lm, ablation)
    log_p = ablated_objective(lm, ablation, torch.cat([without, only, held_out]), batch_size, True, clean).double()
    full = float(clean[0].double().sum())
    answer = log_p.sum(1)
    removed, kept, lds_rows = answer[:k_max], answer[k_max:2 * k_max], log_p[2 * k_max:]
    p = torch.exp
    return RemovalResult(
        top_k_drop=(full - removed).tolist(),
        comprehensiveness=float((p(torch.tensor(full)) - p(removed)).mean()),
        sufficiency=float((p(torch.tensor(full)) - p(kept)).mean()),
        lds=spearman(held_out.double() @ s, logit_response(lds_rows)))


def gold_alignment(scores: torch.Tensor, gold: tuple[int, ...]) -> tuple[float, float]:
    """``(average precision, top-1 hit)`` of the source ranking against the gold sources."""
    evidence = torch.zeros(len(scores), dtype=torch.float64)
    evidence[list(gold)] = 1
    ap = float(average_precision(scores.double(), evidence)[0])
    return ap, float(int(top_order(scores)[0]) in gold)


def span_groups(target: Target) -> torch.Tensor:
    """``(n_sources, n_span)`` 0/1: which content-span tokens form each source (pi-Soft's grouping)."""
    a, b = target.span
    groups = torch.zeros(len(target.prompt.sources), b - a, dtype=torch.float64)
    for i, group in enumerate(target.prompt.sources.groups):
        if min(group) < a or max(group) >= b:
            raise LlmattrError(f"source {i} lies outside the explanation's span: pi-Soft perturbs only the span")
        groups[i, torch.tensor(group) - a] = 1
    return groups


def source_soft(lm: LoadedModel, given: SourceInput, steps: list[int], **options):
    """pi-Soft-NC/NS over sources (module docstring): :func:`~llmattr.faithfulness.soft.evaluate_target` with the
    sources as units."""
    raw = given.scores
    if raw.shape[0] == 1 and given.target.n_steps > 1:  # an answer-level row serves every step
        raw = raw.expand(given.target.n_steps, -1)
    retain, _ = retain_probs(raw, given.signed)
    return evaluate_target(lm, given.target, retain, steps, groups=span_groups(given.target), **options)


def _soft_rows(ctx: MetricContext, routing: str) -> list[Row]:
    expl = check_explanation(ctx.explanation)
    check_tokenizer(expl, ctx.lm)
    options = soft_options(ctx)
    stride = options.pop("step_stride")
    result = source_soft(ctx.lm, source_input(expl), evaluated_steps(expl, stride), routing="dynamic",
                         example=example_key(expl), method=expl.method, **options).to_dict()
    values, se = result["metrics"], result["mc_se"]
    rows = []
    for name in ("pi_soft_ns", "pi_soft_nc"):
        curve = values[name]
        rows += [Row(f"source_{name}", v, x=x, se=e) for x, v, e in zip(curve["x"], curve["values"], se[name],
                                                                        strict=True)]
        rows.append(Row(f"source_{name}_auc", curve["auc"], se=se[f"{name}_auc"]))
    return rows


def _removal_rows(ctx: MetricContext, routing: str) -> list[Row]:
    expl = check_explanation(ctx.explanation)
    check_tokenizer(expl, ctx.lm)
    return removal_metrics(ctx.lm, source_input(expl), ctx.options.get(TOP_K.name),
                           ctx.options.get(LDS_ABLATIONS.name), ctx.options.seed).rows()


def _gold_rows(ctx: MetricContext, routing: str) -> list[Row]:
    given = source_input(check_explanation(ctx.explanation))
    if not given.sources.gold:
        return []
    ap, hit = gold_alignment(given.answer_scores, given.sources.gold)
    return [Row("source_gold_ap", ap), Row("source_gold_top1", hit)]


SOURCE_TABLE = "Per example, the method's scores summed per source; mean over examples, 95% CIs and paired " \
               "tests against the random control."
register(Metric(
    "source-soft", _soft_rows, options=("seed",), declares=SOFT_OPTIONS, rules=(RETAIN_RULE,), granularity="source",
    summary="pi-Soft-NC/NS with the Bernoulli masks over sources (paper 000 eq. 7 at source level)",
    tables=(TableSpec("table_source_pi_soft", "π-Soft-NC/NS over sources (AUC)", SOURCE_TABLE, "datasets_by_methods",
                      (MetricRow("source_pi_soft_ns_auc", "AUC π-Soft-NS (sources)", True),
                       MetricRow("source_pi_soft_nc_auc", "AUC π-Soft-NC (sources)", True)), order=80),)))
register(Metric(
    "source-removal", _removal_rows, options=("seed",), declares=(TOP_K, LDS_ABLATIONS), granularity="source",
    summary="top-k source removal (log-probability drop), comprehensiveness/sufficiency over sources, LDS",
    tables=(TableSpec("table_source_removal", "Source removal: top-k drop, comprehensiveness, sufficiency, LDS",
                      SOURCE_TABLE, "methods_by_datasets",
                      (MetricRow("source_top_k_drop_mean", "Top-k drop", True),
                       MetricRow("source_comprehensiveness", "Comp", True),
                       MetricRow("source_sufficiency", "Suff", False),
                       MetricRow("source_lds", "LDS", True)), order=81),)))
register(Metric(
    "source-gold", _gold_rows, granularity="source",
    summary="alignment with the gold sources: average precision and top-1 hit",
    tables=(TableSpec("table_source_gold", "Alignment with the gold sources", SOURCE_TABLE, "methods_by_datasets",
                      (MetricRow("source_gold_ap", "AP", True), MetricRow("source_gold_top1", "Top-1 hit", True)),
                      order=82),)))
