"""Ranking-based faithfulness metrics: deletion/insertion, comprehensiveness/sufficiency, log-odds, AOPC.

Every metric perturbs the content span by the *rank* of the attribution scores (raw scores, highest
first, ties broken by position) and reads the model's next-token distribution at one explained step:

- deletion / insertion (paper 000 appendix E, after Petsiuk et al. 2018): 20 steps of 5% of the content
  tokens; at each step the *flip probability* = the probability mass on the label words other than
  the original prediction, renormalised over the label words; AUC = trapezoid over the fraction
  removed (deletion: top tokens removed, higher is better) or inserted (insertion: only the top tokens
  kept, lower is better). Both the flip probability (``auc``) and paper 000's quantity, its change
  from the clean input (``change_auc``), are reported;
- comprehensiveness / sufficiency (paper 003 sec. 4.2, eqs. 5-8, after DeYoung et al. 2020): confidence
  drop ``p(y^|X) - p(y^|X \\ K)`` (top K% removed) and ``p(y^|X) - p(y^|X^K)`` (only the top K% kept), and
  the perturbed prediction for the dataset accuracy, at K in {10, ..., 90}%; their means over K are the
  AOPC (DeYoung et al.'s area over the perturbation curve);
- paper 004 appendix A.4 at top-k% (default 20%): log-odds ``log p(y^|x^(k)) / p(y^|x)`` (lower is
  better), comprehensiveness and sufficiency with DeYoung's sign ``p(y^|x) - p(y^|x^(k))`` (004 prints
  the difference the other way round but reads "higher comprehensiveness is better", which only
  DeYoung's sign gives).

``p(y^|.)`` is the probability of the original prediction renormalised over the label words (the
class distribution of a classification prompt); without label words it is the full-vocabulary
probability of the explained token and "flip" is ``1 - p``. Removal is by zeroed embeddings (default,
batched through :class:`~llmattr.faithfulness.engine.PerturbationEngine`) or by deleting the tokens
(``removal="delete"``; left-padded batches). All perturbations of one example run in one batched
call.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from ..declarations import FigureSpec, MetricRow, TableSpec
from ..errors import LlmattrError
from ..explanation import Explanation
from ..lazy import torch
from ..models.forward import padded_last_probs
from ..models.loading import LoadedModel
from ..scores import check_finite
from ..store import Row
from ..targets import Target, visible
from ..tasks import TASKS, get_task
from .engine import PerturbationEngine
from .head import head_faithfulness
from .inputs import target_from_explanation
from .ranks import K_GRID, counts, top_masks
from .registry import Metric, MetricContext, Option, register
from .soft import curve_auc

REMOVALS = ("zero", "delete")
REMOVAL = Option("removal", "zero", "Ranking metrics (deletion-insertion, comp-suff, log-odds): zero the embeddings "
                 "or delete the tokens (paper 003 sec. 4.2.1)", valid=REMOVALS)  # the three declare this one
DI_STEPS = 20
TOP_K = 0.2


# ----------------------------------------------------------------------------- masks and labels

def class_probs(probs: torch.Tensor, label_ids: torch.Tensor | None, token_id: int) -> torch.Tensor:
    """``(N, L)`` probabilities renormalised over the label words, or ``(N, 1)`` p(explained token)."""
    if label_ids is None:
        return probs[:, [token_id]]
    sub = probs[:, label_ids.to(probs.device)]
    return sub / sub.sum(-1, keepdim=True).clamp_min(torch.finfo(sub.dtype).tiny)


# ----------------------------------------------------------------------------- perturbed forwards
def deleted_probs(lm: LoadedModel, target: Target, step: int, keep: torch.Tensor,
                  batch_size: int = 64) -> torch.Tensor:
    """Next-token probabilities ``(N, V)`` at step ``step`` with the span tokens where ``keep`` is 0 deleted.

    The N shortened sequences are left-padded into one matrix by a stable sort (removed positions
    first), so one padded batch runs them all.
    """
    ids = target.input_ids[0, : int(target.positions[step]) + 1]
    a = target.span[0]
    full = torch.ones(keep.shape[0], ids.numel(), dtype=torch.long)
    full[:, a: a + keep.shape[1]] = keep.round().long()
    order = torch.sort(full, dim=1, stable=True).indices
    return padded_last_probs(lm, ids[order], full.gather(1, order), batch_size)


class Perturbed:
    """The clean and perturbed next-token distributions of one (target, step), by zeroing or deletion."""

    def __init__(self, lm: LoadedModel, target: Target, step: int = 0, removal: str = "zero",
                 routing: str = "dynamic", batch_size: int | None = None):
        if removal not in REMOVALS:
            raise LlmattrError(f"unknown removal {removal!r}; use 'zero' or 'delete'")
        if removal == "delete" and routing != "dynamic":
            raise LlmattrError("fixed routing needs zeroed embeddings (removal='zero'): deletion changes the length")
        self.lm, self.target, self.step, self.removal = lm, target, step, removal
        self.engine = PerturbationEngine(lm, target, step, routing, batch_size)
        self.batch_size = batch_size or 64
        self.clean = self.engine.clean_probs.cpu()[None]

    def probs(self, keep: torch.Tensor) -> torch.Tensor:
        """``(N, V)`` probabilities for ``(N, m)`` keep masks (1 kept, 0 removed)."""
        if self.removal == "zero":
            return self.engine.probs(keep.float()).cpu()
        return deleted_probs(self.lm, self.target, self.step, keep, self.batch_size)


# ----------------------------------------------------------------------------- results
@dataclass
class Curve:
    """One perturbation curve: ``fractions`` of content tokens removed/inserted and the flip probability.

    ``flip``/``auc``: the flip probability itself; ``change``/``change_auc``: paper 000 appendix E's
    quantity, the change in flip probability from the clean input (``flip - (1 - p(y^|x))``), which
    differs from ``flip`` by a per-example offset (same ranking of methods on one example).
    """

    fractions: list[float]
    flip: list[float]
    auc: float
    change: list[float] = field(default_factory=list)
    change_auc: float | None = None


@dataclass
class RankingMetrics:
    """Every ranking metric of one explained step (keys in docs/ranking.md)."""

    step: int
    removal: str
    n_tokens: int
    label_ids: list[int] | None
    predicted: int  # index of the original prediction among the label words (0 without label words)
    p_original: float  # p(y^|x)
    deletion: Curve
    insertion: Curve
    k_grid: list[float]
    comprehensiveness: list[float]  # confidence drop at each K (paper 003 eq. 5)
    sufficiency: list[float]  # confidence drop at each K (paper 003 eq. 7)
    comprehensiveness_pred: list[int]  # perturbed prediction at each K, for the accuracy (eq. 6)
    sufficiency_pred: list[int]  # (eq. 8)
    comprehensiveness_aopc: float
    sufficiency_aopc: float
    top_k: float
    log_odds: float  # paper 004 A.4 at top_k
    comprehensiveness_top_k: float
    sufficiency_top_k: float
    values: dict = field(default_factory=dict)  # regression: predicted value clean / per K

    def to_dict(self) -> dict:
        return asdict(self)


def _curve(fractions: torch.Tensor, flip: torch.Tensor, clean_flip: torch.Tensor) -> Curve:
    """The flip-probability curve and its change from the clean input's flip probability."""
    change = flip - clean_flip
    xs = fractions.tolist()  # from 0 to 1: the AUC is the trapezoid area itself, on the flip probability's scale
    return Curve(xs, flip.tolist(), float(curve_auc(flip, xs)), change.tolist(), float(curve_auc(change, xs)))


# ----------------------------------------------------------------------------- entry point
def ranking_metrics(scores: Explanation | torch.Tensor, lm: LoadedModel, target: Target | None = None,
                    label_ids=None, step: int = 0, removal: str = "zero", routing: str = "dynamic",
                    steps: int = DI_STEPS, k_grid=K_GRID, top_k: float = TOP_K, label_values=None,
                    batch_size: int | None = None) -> RankingMetrics:
    """All ranking metrics of one explained step, with every perturbation in one batched call.

    Args:
        scores: an Explanation (its raw scores at ``step``) or a ``(m,)`` tensor over the content span.
        target: the explained target (default: rebuilt from the Explanation).
        label_ids: token ids of the label words (default: the Explanation's task, see
            :func:`default_labels`); None for free generation (flip = 1 - p(explained token)).
        steps: deletion/insertion steps (20 steps of 5%, paper 000 appendix E).
        k_grid: K fractions of comprehensiveness/sufficiency (paper 003: 10%..90%).
        top_k: k of paper 004's log-odds, comprehensiveness and sufficiency (20%).
        label_values: numeric value of each label word (regression tasks such as the prompted STS-B);
            the predicted value ``sum_l value_l p_l`` is reported clean and at each K.
    """
    raw, target, label_ids = _inputs(scores, lm, target, label_ids, step)
    raw = raw[: visible(target, step)]  # scope "all": the tokens this step sees
    m = raw.numel()
    fractions = torch.linspace(0, 1, steps + 1, dtype=torch.float64)
    di_top = top_masks(raw, counts(fractions.tolist(), m))
    k_top = top_masks(raw, counts(list(k_grid), m))
    t_top = top_masks(raw, counts([top_k], m))
    keep = torch.cat([~di_top, di_top, ~k_top, k_top, ~t_top, t_top]).float()
    run = Perturbed(lm, target, step, removal, routing, batch_size)
    token = int(target.target_ids[step])
    clean = class_probs(run.clean, label_ids, token)[0].double()
    pert = class_probs(run.probs(keep), label_ids, token).double()
    pred = int(clean.argmax())
    p0 = clean[pred]
    p_hat = pert[:, pred]
    n, k = steps + 1, len(k_grid)
    del_flip, ins_flip = 1 - p_hat[:n], 1 - p_hat[n: 2 * n]
    comp, suff = p0 - p_hat[2 * n: 2 * n + k], p0 - p_hat[2 * n + k: 2 * n + 2 * k]
    pred_k = pert[2 * n: 2 * n + 2 * k].argmax(-1)
    tiny = torch.finfo(torch.float64).tiny
    values = {}
    if label_values is not None:
        v = torch.as_tensor(label_values, dtype=torch.float64)
        values = {"clean": float(clean @ v), "comprehensiveness": (pert[2 * n: 2 * n + k] @ v).tolist(),
                  "sufficiency": (pert[2 * n + k: 2 * n + 2 * k] @ v).tolist()}
    return RankingMetrics(
        step=step, removal=removal, n_tokens=m, label_ids=None if label_ids is None else label_ids.tolist(),
        predicted=pred, p_original=float(p0),
        deletion=_curve(fractions, del_flip, 1 - p0), insertion=_curve(fractions, ins_flip, 1 - p0),
        k_grid=list(k_grid), comprehensiveness=comp.tolist(), sufficiency=suff.tolist(),
        comprehensiveness_pred=pred_k[:k].tolist(), sufficiency_pred=pred_k[k:].tolist(),
        comprehensiveness_aopc=float(comp.mean()), sufficiency_aopc=float(suff.mean()),
        top_k=top_k, log_odds=float(torch.log(p_hat[-2].clamp_min(tiny) / p0.clamp_min(tiny))),
        comprehensiveness_top_k=float(p0 - p_hat[-2]), sufficiency_top_k=float(p0 - p_hat[-1]),
        values=values,
    )


def default_labels(lm: LoadedModel, task_name: str | None, example: dict | None = None) -> torch.Tensor | None:
    """Label word ids of a task: its ``label_words``; BLiMP: (target, foil) of the example; else None."""
    if not task_name:
        return None
    task = get_task(task_name)
    if task.label_words:
        return task.label_ids(lm.tokenizer)
    if task.next_word and example and example.get("foil"):
        return task.word_ids(lm.tokenizer, [example["label"], example["foil"]])
    return None


def _inputs(scores, lm, target, label_ids, step) -> tuple[torch.Tensor, Target, torch.Tensor | None]:
    """Raw scores ``(m,)``, the target and the label ids, from an Explanation or plain tensors."""
    if isinstance(scores, Explanation):
        if not 0 <= step < len(scores.steps):
            raise LlmattrError(f"step {step} is outside the explanation's {len(scores.steps)} step(s)")
        if label_ids is None:
            label_ids = default_labels(lm, scores.task, scores.example)
        target = target or target_from_explanation(scores)
        scores = scores.score_matrix(raw=True)[step]
    if target is None:
        raise LlmattrError("pass the target the scores were computed on (or an Explanation)")
    raw = torch.as_tensor(scores, dtype=torch.float64).flatten()
    check_finite(raw)
    m = target.span[1] - target.span[0]
    if raw.numel() != m:
        raise LlmattrError(f"scores cover {raw.numel()} tokens but the content span has {m}")
    if label_ids is not None:
        label_ids = torch.as_tensor(label_ids, dtype=torch.long).flatten()
        if label_ids.numel() < 2:
            raise LlmattrError("give at least two label words (or none for free generation)")
    return raw, target, label_ids


def deletion_insertion(scores, lm, target=None, label_ids=None, **kwargs) -> dict:
    """Deletion and insertion curves and AUCs (paper 000 appendix E): ``{"deletion": .., "insertion": ..}``."""
    result = ranking_metrics(scores, lm, target, label_ids, **kwargs)
    return {"deletion": asdict(result.deletion), "insertion": asdict(result.insertion)}


def aggregate(results: list[RankingMetrics], gold: list | None = None) -> dict:
    """Dataset-level numbers: mean AUCs, confidence drops per K and their AOPC, log-odds; with ``gold``
    (label indices, or values for regression) the accuracy per K of paper 003 eqs. 6 and 8 (regression:
    Pearson correlation of the predicted values with the gold values)."""
    if not results:
        raise LlmattrError("no results to aggregate")
    mean = lambda xs: torch.tensor(xs, dtype=torch.float64).mean(0).tolist()  # noqa: E731
    out = {
        "n": len(results), "deletion_auc": mean([r.deletion.auc for r in results]),
        "insertion_auc": mean([r.insertion.auc for r in results]), "k_grid": list(results[0].k_grid),
        "comprehensiveness": mean([r.comprehensiveness for r in results]),
        "sufficiency": mean([r.sufficiency for r in results]),
        "comprehensiveness_aopc": mean([r.comprehensiveness_aopc for r in results]),
        "sufficiency_aopc": mean([r.sufficiency_aopc for r in results]),
        "log_odds": mean([r.log_odds for r in results]),
        "comprehensiveness_top_k": mean([r.comprehensiveness_top_k for r in results]),
        "sufficiency_top_k": mean([r.sufficiency_top_k for r in results]),
    }
    if gold is None:
        return out
    if results[0].values:
        y = torch.tensor(gold, dtype=torch.float64)
        for key in ("comprehensiveness", "sufficiency"):
            pred = torch.tensor([r.values[key] for r in results], dtype=torch.float64).T  # (K, n)
            out[f"{key}_accuracy"] = [float(torch.corrcoef(torch.stack([p, y]))[0, 1]) for p in pred]
        return out
    y = torch.tensor(gold)[:, None]
    for key in ("comprehensiveness", "sufficiency"):
        pred = torch.tensor([getattr(r, f"{key}_pred") for r in results])
        out[f"{key}_accuracy"] = (pred == y).double().mean(0).tolist()
    return out


# ----------------------------------------------------------------------------- registered metrics
def _shared(ctx: MetricContext) -> RankingMetrics:
    """All ranking metrics of the explanation's first step in one batched call, shared by the three
    ranking metrics of one explanation."""
    if _head(ctx):
        raise LlmattrError("a sequence head's explanation is measured by comp-suff (paper 003), not by this metric")
    removal = ctx.options.get(REMOVAL.name)
    return ctx.shared(("ranking", removal), lambda: ranking_metrics(ctx.explanation, ctx.lm, removal=removal))


def _head(ctx: MetricContext) -> bool:
    """Whether the explanation is of a sequence head (``llmattr finetune --head``; :mod:`.head`)."""
    task = TASKS.get(ctx.explanation.task or "")
    return task is not None and task.head != "lm"


def _head_shared(ctx: MetricContext):
    """Paper 003's comprehensiveness/sufficiency of a sequence head's explanation (tokens deleted, :mod:`.head`):
    the same fields per K as :class:`RankingMetrics`."""
    expl = ctx.explanation
    ids = torch.tensor([expl.token_ids], device=ctx.lm.device)
    return ctx.shared(("head-ranking",), lambda: head_faithfulness(ctx.lm.model, ids, expl.score_matrix(raw=True)[0],
                                                                   span=tuple(expl.span)))


def gold_index(expl: Explanation) -> int | None:
    """Index of the gold label among the task's label words (None when there is no gold label)."""
    task = TASKS.get(expl.task or "")
    label = expl.example.get("label")
    words = list(task.label_words) if task is not None else []
    return words.index(label) if label in words else None


def _deletion_insertion_rows(ctx: MetricContext, routing: str) -> list[Row]:
    """Deletion/insertion flip-probability curves, their AUCs and the AUCs of the change in flip probability
    from the clean input (paper 000 appendix E's quantity; Table 4)."""
    r = _shared(ctx)
    rows = []
    for name, curve in (("deletion", r.deletion), ("insertion", r.insertion)):
        rows += [Row(name, v, x=f) for f, v in zip(curve.fractions, curve.flip, strict=True)]
        rows += [Row(f"{name}_auc", curve.auc), Row(f"{name}_change_auc", curve.change_auc)]
    return rows


def _comp_suff_rows(ctx: MetricContext, routing: str) -> list[Row]:
    """Comprehensiveness/sufficiency confidence drops per K and, with a gold label, whether the perturbed
    prediction is correct (paper 003 eqs. 5-8; averaged over K and examples in its Tables 1, 4-6)."""
    r = _head_shared(ctx) if _head(ctx) else _shared(ctx)
    gold = gold_index(ctx.explanation)
    if r.predicted is None:  # a regression head: Acc is Pearson's r over a dataset (eqs. 6, 8; report.head)
        return regression_rows(r, ctx.explanation.example.get("label"))
    rows = []
    for name, drops, preds in (("comprehensiveness", r.comprehensiveness, r.comprehensiveness_pred),
                               ("sufficiency", r.sufficiency, r.sufficiency_pred)):
        rows += [Row(name, v, x=k) for k, v in zip(r.k_grid, drops, strict=True)]
        if gold is not None:
            rows += [Row(f"{name}_acc", float(p == gold), x=k) for k, p in zip(r.k_grid, preds, strict=True)]
    return rows


def regression_rows(r, gold) -> list[Row]:
    """A regression head's per-example part of eqs. 6 and 8: its output with the top K% tokens deleted
    (``comprehensiveness_output``) or kept alone (``sufficiency_output``) at each K, and the gold score
    (``gold_score``, when the example has one); the report correlates them over the examples."""
    rows = [Row(f"{name}_output", v, x=k) for name, outputs in (("comprehensiveness", r.comprehensiveness_pred),
                                                                ("sufficiency", r.sufficiency_pred))
            for k, v in zip(r.k_grid, outputs, strict=True)]
    return rows + ([] if gold is None else [Row("gold_score", float(gold))])


def _log_odds_rows(ctx: MetricContext, routing: str) -> list[Row]:
    """Paper 004 appendix A.4 at the top 20%: log-odds, comprehensiveness and sufficiency."""
    r = _shared(ctx)
    return [Row("log_odds", r.log_odds), Row("comprehensiveness_top_k", r.comprehensiveness_top_k),
            Row("sufficiency_top_k", r.sufficiency_top_k)]


PER_COLUMN = "Averaged over all perturbation ratios; ranks per column."
register(Metric(
    "deletion-insertion", _deletion_insertion_rows, declares=(REMOVAL,),
    summary="deletion/insertion flip-probability AUC (paper 000 app. E; Table 4)",
    tables=(TableSpec("table4_deletion_insertion", "Table 4: deletion and insertion AUC",
                      "Flip probability along 5% steps by rank, and its change from the clean input "
                      "(Δ, paper 000 appendix E's quantity); ranks on every row.", "datasets_by_methods",
                      (MetricRow("deletion_auc", "Deletion", True, ".4f"),
                       MetricRow("insertion_auc", "Insertion", False, ".4f"),
                       MetricRow("deletion_change_auc", "Deletion Δ", True, ".4f"),
                       MetricRow("insertion_change_auc", "Insertion Δ", False, ".4f")),
                      order=40, mark_all_rows=True),)))
COMP_CD, SUFF_CD = MetricRow("comprehensiveness", "Comp CD", True), MetricRow("sufficiency", "Suff CD", False)
COMP_ACC = MetricRow("comprehensiveness_acc", "Comp Acc", False)
SUFF_ACC = MetricRow("sufficiency_acc", "Suff Acc", True)
register(Metric(
    "comp-suff", _comp_suff_rows, declares=(REMOVAL,),
    summary="comprehensiveness/sufficiency per K with accuracy (paper 003 Tables 1, 4-6)",
    tables=(TableSpec("table_comprehensiveness", "Comprehensiveness (paper 003 Tables 1 and 4)", PER_COLUMN,
                      "methods_by_datasets", (COMP_CD, COMP_ACC), order=50),
            TableSpec("table_sufficiency", "Sufficiency (paper 003 Tables 5 and 6)", PER_COLUMN,
                      "methods_by_datasets", (SUFF_CD, SUFF_ACC), order=60)),
    figures=(FigureSpec("fig2_comp_suff", "Comprehensiveness and sufficiency vs K (paper 003 Figs. 2-3)",
                        "Confidence drop and accuracy at each perturbation ratio K (the K% top-ranked tokens "
                        "deleted, or kept alone) on", (COMP_CD, SUFF_CD, COMP_ACC, SUFF_ACC),
                        xlabel="K (ratio of tokens perturbed)", kind="head_curves"),)))
register(Metric(
    "log-odds", _log_odds_rows, declares=(REMOVAL,),
    summary="log-odds, comprehensiveness, sufficiency at top 20% (paper 004 A.4)",
    tables=(TableSpec("table_log_odds", "Log-odds, comprehensiveness and sufficiency at the top 20% "
                      "(paper 004 appendix A.4)", "Ranks per column.", "methods_by_datasets",
                      (MetricRow("log_odds", "Log-odds", False),
                       MetricRow("comprehensiveness_top_k", "Comprehensiveness", True),
                       MetricRow("sufficiency_top_k", "Sufficiency", False)), order=70),)))
