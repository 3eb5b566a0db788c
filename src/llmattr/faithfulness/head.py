"""Paper 003's protocol on a model with a sequence head (``llmattr finetune --head``): sec. 4.1-4.2, Tables 1, 4-6.

Attributions (sec. 4.1) of the head's output for the predicted label (a regression head: its output), each the
``head_scores`` of its registered method (:func:`llmattr.methods.base.explains_head`; :data:`HEAD_METHODS` are the
paper's, in its tables' order):

- ``normxlogit``, ``logat``, ``l2-norm``: :func:`llmattr.methods.logit.classifier_scores` (eqs. 2-4);
- ``saliency`` (Grad. Norm), ``input-x-gradient`` (G x I), ``integrated-gradients`` (IG, zero baseline,
  :data:`~llmattr.methods.integrated.HEAD_STEPS` Gauss-Legendre points: the paper's 25 steps for LLaMA-2):
  gradients of the predicted label's probability (a regression head: its output) w.r.t. the input embeddings, each
  token's vector reduced by the l1 norm ("using the l1 norm for aggregation"), :mod:`llmattr.methods.gradient`;
- ``random``: a seeded random ranking.

Faithfulness (sec. 4.2), with the tokens deleted (auto-regressive models: "deletions are employed"), at each
ratio K of :data:`~llmattr.faithfulness.ranking.K_GRID` (10%, ..., 90%), the K% top-ranked tokens being
``counts(K, m)`` of the m tokens (round half up; at least one token stays in both sequences)::

    Comp_CD(K) = 1/m sum_i f_y^(X_i) - f_y^(X_i \\ K)        (eq. 5)    Comp_Acc(K) = Acc(D^\\K)   (eq. 6)
    Suff_CD(K) = 1/m sum_i f_y^(X_i) - f_y^(X_i^K)          (eq. 7)    Suff_Acc(K) = Acc(D^K)     (eq. 8)

with ``f_y^`` the softmax probability of the predicted label; Acc is the accuracy against the gold labels, or,
for a regression head, Pearson's correlation of the perturbed outputs with the gold scores. Table 1 averages over K.
All perturbed sequences of one example run in one right-padded batch (the head reads the last real token).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

import numpy as np

from ..errors import LlmattrError
from ..explanation import Explanation
from ..lazy import torch
from ..methods import REGISTRY, AttributionMethod
from ..methods.base import explains_head
from ..stats import paired_test, pearson_columns, stable_seed
from .ranks import K_GRID, counts, top_masks

HEAD_METHODS = ("normxlogit", "logat", "l2-norm", "saliency", "input-x-gradient", "integrated-gradients", "random")
BOOTSTRAP = 2000


def head_method(method: str) -> type[AttributionMethod]:
    """The registered method ``method`` where it explains a sequence head; otherwise one line naming those that do."""
    cls = REGISTRY.get(method)
    if cls is None or not explains_head(cls):
        valid = [name for name, each in REGISTRY.items() if explains_head(each)]
        raise LlmattrError(f"{method} does not explain a sequence head; use one of {', '.join(valid)}")
    return cls


def head_attribution(model: torch.nn.Module, input_ids: torch.Tensor, method: str, seed: int = 0) -> torch.Tensor:
    """Scores ``(S,)`` of every token of ``input_ids`` ``(1, S)`` by ``method``'s ``head_scores``."""
    return head_method(method).head_scores(model, input_ids, seed)


@dataclass
class HeadFaithfulness:
    """Comprehensiveness and sufficiency of one example's ranking at each K (paper 003 eqs. 5-8)."""

    k_grid: list[float]
    predicted: int | None  # the predicted label (None: regression)
    p_original: float  # f_y^(X), or the regression output
    comprehensiveness: list[float]  # confidence drop at each K (eq. 5); regression: the output at each K
    sufficiency: list[float]  # (eq. 7)
    comprehensiveness_pred: list[float]  # perturbed prediction at each K: label index, or output (eqs. 6, 8)
    sufficiency_pred: list[float]

    def to_dict(self) -> dict:
        return asdict(self)


def kept_sequences(input_ids: torch.Tensor, scores: torch.Tensor, k_grid,
                   span: tuple[int, int] | None = None) -> list[torch.Tensor]:
    """The clean sequence, then per K the sequence without its top K% tokens (comprehensiveness), then per K the
    top K% tokens alone (sufficiency), in their order; at least one token stays in each. ``span``: only the
    tokens of the example's text (``scores`` has one per token of it) are ranked and deleted; the template's
    tokens before and after it stay in every sequence (default: every token)."""
    ids = input_ids[0]
    start, end = span or (0, ids.numel())
    text, before, after = ids[start:end], ids[:start], ids[end:]
    m = text.numel()
    ks = [min(max(k, 1), m - 1) if m > 1 else 1 for k in counts(list(k_grid), m)]
    top = top_masks(scores, ks)
    return [ids, *(torch.cat([before, part, after]) for part in (*(text[~row] for row in top),
                                                                  *(text[row] for row in top)))]


def head_faithfulness(model: torch.nn.Module, input_ids: torch.Tensor, scores: torch.Tensor,
                      k_grid=K_GRID, span: tuple[int, int] | None = None) -> HeadFaithfulness:
    """Eqs. 5-8 for one example: every perturbed sequence in one right-padded forward; ``span``: the tokens of the
    example's text, the only ones ranked and deleted (:func:`kept_sequences`)."""
    start, end = span or (0, input_ids.shape[1])
    if scores.numel() != end - start:
        raise LlmattrError(f"scores cover {scores.numel()} tokens but the input's text has {end - start}")
    seqs = kept_sequences(input_ids, scores, k_grid, span)
    pad = model.config.pad_token_id if model.config.pad_token_id is not None else 0
    batch = torch.nn.utils.rnn.pad_sequence(seqs, batch_first=True, padding_value=pad)
    mask = torch.nn.utils.rnn.pad_sequence([torch.ones_like(s) for s in seqs], batch_first=True)
    with torch.no_grad():
        logits = model(input_ids=batch, attention_mask=mask).logits.double().cpu()
    k = len(k_grid)
    if logits.shape[-1] == 1:
        out = logits[:, 0]
        return HeadFaithfulness(list(k_grid), None, float(out[0]), out[1: k + 1].tolist(), out[k + 1:].tolist(),
                                out[1: k + 1].tolist(), out[k + 1:].tolist())
    probs = logits.softmax(-1)
    pred = int(probs[0].argmax())
    drop = probs[0, pred] - probs[1:, pred]
    labels = probs[1:].argmax(-1).double()
    return HeadFaithfulness(list(k_grid), pred, float(probs[0, pred]), drop[:k].tolist(), drop[k:].tolist(),
                            labels[:k].tolist(), labels[k:].tolist())


def head_input(lm, task, example: dict) -> tuple[str, dict, torch.Tensor, tuple[int, int]]:
    """What the head reads of ``example`` (:meth:`Task.head_input_ids`): its text, the tokenizer's encoding with
    offsets, the ids ``(1, n)`` on the model's device and the span of the example's own text (:meth:`Task.head_span`,
    what paper 003 attributes and deletes)."""
    text = task.user_content(example)[0]
    enc = lm.tokenizer(text, return_offsets_mapping=True)
    ids = torch.tensor([enc["input_ids"]], device=lm.device)
    return text, enc, ids, task.head_span([tuple(o) for o in enc["offset_mapping"]], example)


def head_explanation(lm, task, example: dict, method: str, seed: int = 0) -> Explanation:
    """``method``'s scores of every token the head reads (:meth:`Task.head_input_ids`) as an Explanation of one
    step: the predicted label (its index, its probability) or, for a regression head, the output (its value in
    ``logit``; token ``score``)."""
    task.check_model(lm)
    signed = head_method(method).head_signed  # the gradient methods' l1 norms are >= 0
    text, enc, ids, span = head_input(lm, task, example)
    start = time.perf_counter()
    scores = head_attribution(lm.model, ids, method, seed)[span[0]: span[1]]  # the text's tokens (paper 003)
    seconds = time.perf_counter() - start
    with torch.no_grad():
        logits = lm.model(input_ids=ids).logits[0].double().cpu()
    regression = logits.numel() == 1
    label = 0 if regression else int(logits.argmax())
    return Explanation.from_raw(
        scores[None].cpu(), signed and not regression, step_tokens=["score" if regression else task.label_words[label]],
        step_ids=[label], positions=[ids.shape[1] - 1], logits=[float(logits[label])],
        step_probs=None if regression else [float(logits.softmax(-1)[label])],
        model=lm.model_id, method=method, params={}, tokens=[lm.tokenizer.decode([i]) for i in enc["input_ids"]],
        token_ids=list(enc["input_ids"]), span=span, timings={"attribution_s": seconds},
        task=task.name, text=text, offsets=[tuple(o) for o in enc["offset_mapping"]],
        generated="" if regression else task.label_words[label], forced=False, example=example, scope="span",
    )


def explain_examples(lm, task, examples: list[dict], methods=HEAD_METHODS, progress=None) -> dict:
    """Every method's ranking and its faithfulness on each example: ``{method: [HeadFaithfulness]}``, the gold
    labels (label indices, or scores), the clean predictions and the seconds per method."""
    task.check_model(lm)
    by_method: dict = {m: [] for m in methods}
    seconds = dict.fromkeys(methods, 0.0)
    gold, clean = [], []
    for i, ex in enumerate(examples):
        _, _, ids, span = head_input(lm, task, ex)
        gold.append(float(ex["label"]) if task.numeric else float(task.label_words.index(ex["label"])))
        for method in methods:
            start = time.perf_counter()
            scores = head_attribution(lm.model, ids, method, seed=stable_seed(ex["id"], bits=31))[span[0]: span[1]]
            seconds[method] += time.perf_counter() - start
            result = head_faithfulness(lm.model, ids, scores.cpu(), span=span)
            by_method[method].append(result)
        clean.append(result.p_original if task.numeric else result.predicted)
        if progress:
            progress(i + 1, len(examples))
    return {"by_method": by_method, "gold": gold, "clean": clean, "seconds": seconds}


# ----------------------------------------------------------------------------- dataset level (Tables 1, 4-6)
def per_example(results: list[HeadFaithfulness], gold: list[float], criterion: str) -> np.ndarray:
    """Each example's value averaged over K: its confidence drop (classification) or whether its perturbed
    prediction is right (``criterion`` ``..._acc``); ``(n,)``."""
    key = criterion.removesuffix("_acc")
    if criterion.endswith("_acc"):
        pred = np.array([getattr(r, f"{key}_pred") for r in results])
        return (pred == np.array(gold)[:, None]).mean(1)
    return np.array([getattr(r, key) for r in results]).mean(1)


def pearson_over_k(results: list[HeadFaithfulness], gold: list[float], key: str, rows=None) -> float:
    """Mean over K of Pearson's r between the perturbed outputs and the gold scores (regression Acc, eq. 6/8)."""
    pred = np.array([getattr(r, f"{key}_pred") for r in results])
    y = np.array(gold, dtype=np.float64)
    if rows is not None:
        pred, y = pred[rows], y[rows]
    return float(pearson_columns(pred, y).mean())


def summarize(by_method: dict[str, list[HeadFaithfulness]], gold: list[float], reference: str = "normxlogit",
              seed: int = 0) -> dict:
    """Per method and criterion (comprehensiveness/sufficiency x CD/Acc): the value averaged over K (Table 1),
    the curve over K (Figures 2-3), a 95% bootstrap interval over examples, and the paired p-value against
    ``reference`` and against ``random`` (sign-flip test on the per-example values; for Pearson's r a paired
    bootstrap: the share of resamples whose difference crosses 0, doubled)."""
    regression = next(iter(by_method.values()))[0].predicted is None
    criteria = (("comprehensiveness_acc", "sufficiency_acc") if regression else
                ("comprehensiveness", "sufficiency", "comprehensiveness_acc", "sufficiency_acc"))
    n = len(gold)
    rng = np.random.default_rng(seed)
    resamples = rng.integers(0, n, size=(BOOTSTRAP, n))
    out: dict = {"n": n, "k_grid": list(K_GRID), "regression": regression, "methods": {}}
    boots: dict = {}
    values: dict = {}
    for method, results in by_method.items():
        row = {}
        for criterion in criteria:
            key = criterion.removesuffix("_acc")
            if regression:
                mean = pearson_over_k(results, gold, key)
                boot = np.array([pearson_over_k(results, gold, key, rows) for rows in resamples])
                curve = pearson_columns(np.array([getattr(r, f"{key}_pred") for r in results]),
                                        np.array(gold, dtype=np.float64)).tolist()
            else:
                vals = per_example(results, gold, criterion)
                values[method, criterion] = vals
                mean, boot = float(vals.mean()), vals[resamples].mean(1)
                curve = (np.array([getattr(r, key) for r in results]).mean(0).tolist() if criterion == key else
                         (np.array([getattr(r, f"{key}_pred") for r in results]) == np.array(gold)[:, None])
                         .mean(0).tolist())
            boots[method, criterion] = boot
            row[criterion] = {"mean": mean, "low": float(np.nanquantile(boot, 0.025)),
                              "high": float(np.nanquantile(boot, 0.975)), "curve": curve}
        out["methods"][method] = row
    for method, row in out["methods"].items():
        for criterion, cell in row.items():
            for other in (reference, "random"):
                if other == method or other not in by_method:
                    continue
                if regression:
                    diff = boots[method, criterion] - boots[other, criterion]
                    p = min(1.0, max(2 * min((diff <= 0).mean(), (diff >= 0).mean()), 1 / BOOTSTRAP))
                else:
                    p = paired_test({"d": dict(enumerate(values[method, criterion]))},
                                    {"d": dict(enumerate(values[other, criterion]))})
                cell[f"p_vs_{other}"] = p
    return out


__all__ = ["HEAD_METHODS", "HeadFaithfulness", "head_attribution", "head_faithfulness", "summarize"]
