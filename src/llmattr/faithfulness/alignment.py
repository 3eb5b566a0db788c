"""Alignment of attributions with gold evidence (paper 003 sec. 5.2, worked example A.4).

The gold evidence is a binary vector E over the content tokens (1 = evidence, e.g. BLiMP's determiner or
subject: a task's ``evidence`` rule, :mod:`llmattr.tasks.blimp`), the explanation a score vector S:

- dot product ``E . S``: the attribution mass on the evidence; S is first made non-negative and
  normalised to sum 1 (``normalize="sum"``, as the A.4 example's S = [0.3, 0.1, 0.5, 0.1]), so it
  reads as the share of the attribution that falls on the evidence (``normalize=None`` keeps S);
- average precision (eq. 9) ``AP = sum_k (R_k - R_{k-1}) P_k`` over the tokens ranked by S (highest
  first; ties keep token order, as A.4 ranks S = [0.3, 0.1, 0.5, 0.1] as [2, 0, 1, 3]).

Per layer: a ``(L, m)`` score matrix gives one value per row; :func:`layer_scores` runs a method with a
layer parameter (``AttributionMethod.layer_param``: LogAt, NormXLogit, value zeroing, and any method that
declares one) once per layer. The ``alignment-layers`` metric (paper 003 sec. 5, Figs. 4-5) stores both
values at every layer ``l = 1..L`` (the output of block ``l``; the store's ``pi`` column holds ``l``) for
such methods, and once (``pi = -1``) for a method without layers (random, the control).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from .. import methods
from ..declarations import MetricRow, TableSpec
from ..errors import LlmattrError
from ..explanation import Explanation
from ..lazy import torch
from ..scores import check_finite, pos_norm
from ..store import Row
from ..tasks import TASKS
from .inputs import target_from_explanation
from .registry import Metric, MetricContext, register

NORMALIZE = ("sum", None)


def _as_2d(scores) -> torch.Tensor:
    s = torch.as_tensor(scores, dtype=torch.float64)
    check_finite(s)
    return s[None] if s.dim() == 1 else s


def _evidence(evidence, m: int) -> torch.Tensor:
    e = torch.as_tensor(evidence, dtype=torch.float64).flatten()
    if e.numel() != m or not ((e == 0) | (e == 1)).all() or not e.any():
        raise LlmattrError(f"evidence must be a 0/1 vector over the {m} scored tokens with at least one 1")
    return e


def normalized(scores, normalize: str | None = "sum") -> torch.Tensor:
    """``(L, m)`` scores: positive part over its sum per row (``"sum"``), or as given (``None``)."""
    s = _as_2d(scores)
    if normalize is None:
        return s
    if normalize != "sum":
        raise LlmattrError(f"normalize must be 'sum' or None; got {normalize!r}")
    return pos_norm(s)


def dot_product(scores, evidence, normalize: str | None = None) -> torch.Tensor:
    """``E . S`` per row of ``scores`` (``(m,)`` or ``(L, m)``): the attribution on the evidence."""
    s = normalized(scores, normalize)
    return s @ _evidence(evidence, s.shape[-1])


def average_precision(scores, evidence) -> torch.Tensor:
    """Eq. 9: ``sum_k (R_k - R_{k-1}) P_k``, the precision at each rank where a new evidence token appears,
    averaged over the evidence tokens; ranks by descending score, ties in token order (A.4)."""
    s = _as_2d(scores)
    e = _evidence(evidence, s.shape[-1])
    order = torch.sort(-s, dim=-1, stable=True).indices
    hits = e[order]  # (L, m): 1 where the k-th ranked token is evidence
    precision = hits.cumsum(-1) / torch.arange(1, s.shape[-1] + 1, dtype=s.dtype)
    return (precision * hits).sum(-1) / e.sum()


@dataclass
class Alignment:
    """Dot product and AP, one value per scored row (steps of an Explanation, or layers)."""

    dot_product: list[float]
    average_precision: list[float]
    normalize: str | None
    level: str

    def to_dict(self) -> dict:
        return asdict(self)


def evidence_vector(expl: Explanation, evidence_words: list[int], level: str = "token") -> torch.Tensor:
    """0/1 over the content-span tokens (``level="token"``) or words (``"word"``) from evidence word indices
    into the content text split on spaces (the loaders' ``evidence_words``)."""
    groups = expl.word_groups()
    if any(not 0 <= i < len(groups) for i in evidence_words):
        raise LlmattrError(f"evidence word index outside the content's {len(groups)} words")
    if level == "word":
        e = torch.zeros(len(groups), dtype=torch.float64)
        e[list(evidence_words)] = 1
        return e
    if level != "token":
        raise LlmattrError(f"level must be 'token' or 'word'; got {level!r}")
    e = torch.zeros(expl.span[1] - expl.span[0], dtype=torch.float64)
    for i in evidence_words:
        e[groups[i]] = 1
    return e


def alignment(scores, evidence, normalize: str | None = "sum", level: str = "token") -> Alignment:
    """Dot product and average precision of ``(m,)`` or ``(L, m)`` scores with a 0/1 evidence vector."""
    return Alignment(dot_product(scores, evidence, normalize).tolist(),
                     average_precision(scores, evidence).tolist(), normalize, level)


def gold_evidence(expl: Explanation, evidence_words: list[int] | None = None) -> list[int]:
    """The evidence word indices: ``evidence_words``, else the example's (``example["evidence_words"]``, which
    the loader stores for a task with an evidence rule: ``Task.evidence``); one line naming those tasks if there
    are none."""
    words = evidence_words if evidence_words is not None else expl.example.get("evidence_words")
    if not words:
        tasks = ", ".join(name for name, task in TASKS.items() if task.evidence is not None)
        raise LlmattrError(f"no gold evidence: pass evidence_words or explain an example loaded for a task with "
                           f"gold evidence ({tasks})")
    return words


def explanation_alignment(expl: Explanation, evidence_words: list[int] | None = None, level: str = "token",
                          normalize: str | None = "sum") -> Alignment:
    """Alignment of every step's raw scores with the example's evidence (``example["evidence_words"]`` of
    a BLiMP row unless given); ``level="word"`` sums sub-word raw scores per word first."""
    evidence = evidence_vector(expl, gold_evidence(expl, evidence_words), level)
    raw = torch.from_numpy(expl.words()[1]) if level == "word" else expl.score_matrix(raw=True)
    return alignment(raw, evidence, normalize, level)


def n_layers(lm) -> int:
    return lm.config.get_text_config().num_hidden_layers


def layer_scores(lm, target, method: str, layers: list[int] | None = None, **params) -> torch.Tensor:
    """``(L, n_steps, m)`` raw scores of ``method`` with its layer parameter (``layer_param``, e.g. ``layer``
    of LogAt and NormXLogit, ``layers`` of value zeroing) at each of ``layers`` (default: every layer)
    (:meth:`~llmattr.methods.AttributionMethod.layer_scores`)."""
    found = methods.get(method, **params)
    if methods.layer_parameter(type(found)) is None:
        raise LlmattrError(f"method {method} has no layer parameter; per-layer alignment needs one")
    return found.layer_scores(lm, target, list(range(n_layers(lm))) if layers is None else layers).double()


def per_layer_scores(lm, target, method: str, layers: list[int] | None = None, step: int = 0,
                     **params) -> torch.Tensor:
    """``(L, m)`` scores of ``method`` (one with a layer parameter, e.g. ``logat``, ``normxlogit``) at
    each layer (default: every layer), for explained step ``step``."""
    return layer_scores(lm, target, method, layers, **params)[:, step]


def _alignment_rows(ctx: MetricContext, routing: str) -> list[Row]:
    """Dot product and AP of each explained step with the example's gold evidence (BLiMP loaders)."""
    result = explanation_alignment(ctx.explanation)
    return [Row(name, v, step=i) for name, values in (("dot_product", result.dot_product),
                                                      ("average_precision", result.average_precision))
            for i, v in enumerate(values)]


register(Metric(
    "alignment", _alignment_rows,
    summary="dot product and average precision with gold evidence words (paper 003 sec. 5.2; BLiMP datasets)",
    tables=(TableSpec("table_alignment", "Alignment with gold evidence (paper 003 Table 3)",
                      "Dot product of the sum-normalised scores with the 0/1 evidence vector, and average "
                      "precision (eq. 9) of the evidence in the ranking; ranks per column.",
                      "methods_by_datasets", (MetricRow("dot_product", "Dot product", True),
                                              MetricRow("average_precision", "AP", True)), order=80),)))


LAYER_METRICS = (("layer_dot_product", "dot_product"), ("layer_average_precision", "average_precision"))


def _layer_alignment_rows(ctx: MetricContext, routing: str) -> list[Row]:
    """Paper 003 sec. 5 (Figs. 4-5): dot product and AP of every step with the gold evidence at every layer
    ``l = 1..L`` (row ``pi = l``: the explanation's method rerun with its layer parameter at block ``l - 1``;
    its other parameters kept), or once (``pi`` unset) from the stored scores of a method without layers."""
    expl = ctx.explanation
    evidence = evidence_vector(expl, gold_evidence(expl))
    cls = methods.REGISTRY.get(expl.method)
    param = None if cls is None else methods.layer_parameter(cls)
    if param is None:
        per_layer, numbers = expl.score_matrix(raw=True)[None], [None]
    else:
        params = {k: v for k, v in expl.params.items() if k != param}
        per_layer = layer_scores(ctx.lm, target_from_explanation(expl), expl.method, **params)
        numbers = list(range(1, per_layer.shape[0] + 1))
    rows = []
    for layer, scores in zip(numbers, per_layer, strict=True):
        result = alignment(scores, evidence).to_dict()
        rows += [Row(name, v, x=layer, step=t) for name, key in LAYER_METRICS for t, v in enumerate(result[key])]
    return rows


register(Metric(
    "alignment-layers", _layer_alignment_rows,
    summary="dot product and AP with gold evidence at every layer, per-layer methods swept over their layer "
            "parameter (paper 003 sec. 5, Figs. 4-5; BLiMP datasets)",
    tables=(TableSpec("table_alignment_layers", "Per-layer alignment with gold evidence (paper 003 Figs. 4-5)",
                      "Rows: layer l (the output of block l); columns: methods, each with its layer parameter at "
                      "layer l (a method without layers, e.g. Random, repeats its one value). Cell: mean over the "
                      "datasets (BLiMP paradigms) of the mean over their examples of the dot product of the "
                      "sum-normalised scores with the 0/1 evidence vector, and of the average precision (eq. 9); "
                      "ranks per row.",
                      "layers_by_methods", (MetricRow("layer_dot_product", "Dot product", True),
                                            MetricRow("layer_average_precision", "AP", True)),
                      order=81, mark_all_rows=True),)))
