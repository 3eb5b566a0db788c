"""F-Fidelity (Zheng et al., ICLR 2025, "F-Fidelity: A Robust Framework for Faithfulness Evaluation of
Explainable AI"; docs/trust.md): a removal test made in distribution.

The model is first fine-tuned with random-mask augmentation (``llmattr finetune --mask-augment BETA``: each
training row loses a random subset of at most ``K = round(beta m)`` of its ``m`` text tokens); the test then never
removes more than ``K`` tokens, so every input it feeds the model is one the fine-tuning showed it. At each ratio
``alpha`` of the explanation's ranking, with ``T_alpha`` the top ``round(alpha m)`` tokens (ties: earlier first)::

    FFid+(alpha) = p(y^|x) - 1/N sum_n p(y^ | x \\ S_n),   S_n ~ U{ S in T_alpha : |S| = min(|T_alpha|, K) }
    FFid-(alpha) = p(y^|x) - 1/N sum_n p(y^ | x \\ R_n),   R_n ~ U{ R in T_alpha^c : |R| = min(|T_alpha^c|, K) }

(stochastic removal of a random subset of the top-``alpha`` tokens, resp. of the rest, N samples each); ``p(y^|.)``
is the original prediction's probability renormalised over the label words, as in comp-suff
(:func:`~.ranking.class_probs`). A faithful explanation has a large FFid+ and a small FFid-. Tokens are deleted
(:func:`deleted_after_prefix`: the template before the text runs once), as the fine-tuning deletes them. Every
removal set of an example runs in one padded batch; the sets repeated among the samples (where ``|T_alpha| <= K``
the removal is the whole top set) run once.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..checks import mask_rate
from ..declarations import FigureSpec, MetricRow, TableSpec
from ..errors import LlmattrError
from ..lazy import no_grad, torch
from ..models.forward import SharedPrefix, padded_last_probs
from ..stats import stable_seed
from ..store import Row
from ..targets import Target
from .inputs import example_key
from .ranking import _head, _inputs, class_probs, deleted_probs
from .ranks import K_GRID, counts, top_masks
from .registry import Metric, MetricContext, Option, register


def ffid_beta(value: float) -> float:
    """``--ffid-beta``'s check hook (f-fidelity's option): a fraction in [0, 1) (:func:`checks.mask_rate`)."""
    return mask_rate(value, "--ffid-beta")


FFID_BETA = Option("ffid_beta", 0.1, "f-fidelity: the most tokens removed, as a fraction of the text (F-Fidelity's "
                   "beta: the fine-tuning's --mask-augment rate)", validate=ffid_beta)
FFID_SAMPLES = Option("ffid_samples", 16, "f-fidelity: random removal sets drawn per ratio (F-Fidelity's N)",
                      positive=True)


def removal_bound(beta: float, m: int) -> int:
    """``K = round(beta m)`` (half up, :func:`~.ranks.counts`): the most of ``m`` text tokens one removal deletes,
    in the fine-tuning's augmentation and in the test alike."""
    return counts([beta], m)[0]


def augment_mask(m: int, beta: float, gen: torch.Generator) -> torch.Tensor:
    """The fine-tuning's random mask (``llmattr finetune --mask-augment``): ``(m,)`` bool, True where a text token
    is deleted; ``k ~ U{0..K}`` positions, a uniformly random subset, so every removal size the test makes was
    seen in training."""
    k = int(torch.randint(0, removal_bound(beta, m) + 1, (1,), generator=gen))
    removed = torch.zeros(m, dtype=torch.bool)
    removed[torch.randperm(m, generator=gen)[:k]] = True
    return removed


@dataclass
class FFidelity:
    """F-Fidelity of one explained step: FFid+ and FFid- at each ratio ``alpha`` and their means over the ratios."""

    ratios: list[float]
    plus: list[float]
    minus: list[float]
    removed: int  # K = round(beta m): the most tokens one removal set holds
    p_original: float

    @property
    def plus_mean(self) -> float:
        return sum(self.plus) / len(self.plus)

    @property
    def minus_mean(self) -> float:
        return sum(self.minus) / len(self.minus)


def random_subsets(pool: torch.Tensor, size: torch.Tensor, samples: int, gen: torch.Generator) -> torch.Tensor:
    """``(R, N, m)`` bool: for each of the ``R`` rows of ``pool`` (``(R, m)`` bool), ``N`` uniformly random subsets
    of its marked positions of ``size[r]`` elements each (the ``size[r]`` smallest of i.i.d. uniform keys)."""
    keys = torch.rand((*pool.shape[:1], samples, pool.shape[1]), generator=gen, dtype=torch.float64)
    keys = keys.masked_fill(~pool[:, None, :], float("inf"))
    rank = keys.argsort(-1).argsort(-1)
    return rank < size[:, None, None]


def removal_sets(scores: torch.Tensor, ratios, beta: float, samples: int,
                 gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, int]:
    """``(plus, minus, K)``: ``(R, N, m)`` removal masks of FFid+ (from the top-``alpha`` tokens) and FFid- (from
    the rest), each set of ``min(pool, K)`` tokens, ``K = round(beta m)``."""
    m = scores.numel()
    top = top_masks(scores, counts(list(ratios), m))
    most = removal_bound(beta, m)
    plus = random_subsets(top, top.sum(-1).clamp(max=most), samples, gen)
    minus = random_subsets(~top, (~top).sum(-1).clamp(max=most), samples, gen)
    return plus, minus, most


@no_grad
def deleted_after_prefix(lm, target: Target, step: int, removed: torch.Tensor, batch_size: int = 64) -> torch.Tensor:
    """Next-token probabilities ``(N, V)`` at ``step`` with the span tokens where ``removed`` ``(N, m)`` is True
    deleted: :func:`~.ranking.deleted_probs` with the template before the span run once
    (:class:`~llmattr.models.forward.SharedPrefix`); each row's remaining tokens are left-padded after it (the
    padding masked, position ids counting the kept tokens only)."""
    ids = target.input_ids[0, : int(target.positions[step]) + 1]
    a = target.span[0]
    if not a:
        return deleted_probs(lm, target, step, (~removed).long(), batch_size)
    prefix = SharedPrefix.compute(lm, ids[None], a)
    keep = torch.ones(removed.shape[0], ids.numel() - a, dtype=torch.long)
    keep[:, : removed.shape[1]] = (~removed).long()
    order = torch.sort(keep, dim=1, stable=True).indices  # removed tokens first: the padding
    return padded_last_probs(lm, ids[a:][order], keep.gather(1, order), batch_size, prefix)


def f_fidelity(scores, lm, target: Target | None = None, label_ids=None, step: int = 0, ratios=K_GRID,
               beta: float = 0.1, samples: int = 16, seed: int = 0, batch_size: int | None = None) -> FFidelity:
    """FFid+ and FFid- (module docstring) of one explained step at each of ``ratios``.

    Args:
        scores: an Explanation (its raw scores at ``step``) or a ``(m,)`` tensor over the content span.
        beta: the fine-tuning's mask rate; at most ``round(beta m)`` tokens are removed at once.
        samples: N, the random removal sets per ratio and side.
        seed: seeds the removal sets (with the run's seed and the example, :func:`~.inputs.example_key`).
    """
    mask_rate(beta, "beta")
    raw, target, label_ids = _inputs(scores, lm, target, label_ids, step)
    if label_ids is None:
        raise LlmattrError("f-fidelity reads a classification's label words; the explanation's task has none")
    plus, minus, most = removal_sets(raw, ratios, beta, samples, torch.Generator().manual_seed(seed))
    removed = torch.cat([plus, minus]).flatten(0, 1)  # (2 R N, m)
    unique, inverse = torch.unique(torch.cat([torch.zeros_like(removed[:1]), removed]), dim=0, return_inverse=True)
    probs = class_probs(deleted_after_prefix(lm, target, step, unique, batch_size or 64), label_ids, 0).double()
    p = probs[inverse]  # (1 + 2 R N, L): the clean input first (nothing removed)
    pred = int(p[0].argmax())
    drop = (p[0, pred] - p[1:, pred]).view(2, len(ratios), samples).mean(-1)
    return FFidelity(list(ratios), drop[0].tolist(), drop[1].tolist(), most, float(p[0, pred]))


def _rows(ctx: MetricContext, routing: str) -> list[Row]:
    """FFid+ / FFid- at each ratio (x) of the explanation's first step."""
    if _head(ctx):
        raise LlmattrError("f-fidelity reads the label words of an LM head; a sequence head's explanation is "
                           "measured by comp-suff (paper 003)")
    expl = ctx.explanation
    seed = stable_seed(ctx.options.get("seed"), example_key(expl), "f-fidelity")
    r = f_fidelity(expl, ctx.lm, beta=ctx.options.get(FFID_BETA.name), samples=ctx.options.get(FFID_SAMPLES.name),
                   seed=seed)
    return ([Row("ffid_plus", v, x=a) for a, v in zip(r.ratios, r.plus, strict=True)]
            + [Row("ffid_minus", v, x=a) for a, v in zip(r.ratios, r.minus, strict=True)])


FFID_PLUS, FFID_MINUS = MetricRow("ffid_plus", "FFid+", True), MetricRow("ffid_minus", "FFid-", False)
register(Metric(
    "f-fidelity", _rows, options=("seed",), declares=(FFID_BETA, FFID_SAMPLES),
    summary="F-Fidelity's FFid+/FFid- (Zheng et al. 2025): at most beta of the tokens removed, on a "
            "--mask-augment model",
    tables=(TableSpec("table_f_fidelity", "F-Fidelity (Zheng et al. 2025)",
                      "Confidence drop when a random subset of at most round(beta m) of the top-alpha tokens "
                      "(FFid+) or of the others (FFid-) is deleted, averaged over alpha = 10%..90%; meant for a "
                      "model fine-tuned with --mask-augment beta.", "methods_by_datasets", (FFID_PLUS, FFID_MINUS),
                      order=75),),
    figures=(FigureSpec("fig_f_fidelity", "F-Fidelity vs the ratio alpha",
                        "FFid+ and FFid- at each ratio alpha of top-ranked tokens on", (FFID_PLUS, FFID_MINUS),
                        xlabel="alpha (ratio of top-ranked tokens)"),)))
