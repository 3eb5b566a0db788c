"""Every statistic llmattr reports about its own numbers, on scipy (docs/evaluate.md, "Uncertainty").

* :func:`mc_standard_error`: the Monte-Carlo standard error of a mean over samples (``scipy.stats.sem``).
* :func:`estimate`: a mean over examples with a 95% bootstrap confidence interval
  (``scipy.stats.bootstrap``, BCa, seeded). Data come as strata (datasets) of examples; the estimate is
  the mean over strata of the per-stratum means (the Avg row of a table) and the bootstrap resamples
  examples *within* each stratum. One stratum is the plain mean over examples.
* :func:`paired_test`: a paired permutation test (sign flips of the per-example differences,
  ``scipy.stats.permutation_test`` with ``permutation_type="samples"``) of the same statistic, so the
  test and the interval speak about the same quantity: the difference of the two means.
* :func:`holm`: Holm's step-down adjustment of a family of p-values.
* :func:`significance_ranks`: best / 2nd / 3rd only where the difference to the next method is
  significant (Holm-adjusted across the row), shared ranks otherwise.
"""

from __future__ import annotations

import hashlib
import math
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from .lazy import lazy

sps = lazy("scipy.stats")

CONFIDENCE = 0.95
RESAMPLES = 2000  # bootstrap resamples per interval (``llmattr report --bootstrap N``)
PERMUTATIONS = 9999  # sign-flip resamples per paired test (exact when 2**n <= this)
ALPHA = 0.05
SEED = 0

Strata = Mapping[str, Mapping[str, float]]  # stratum (dataset) -> example id -> per-example value


@dataclass(frozen=True)
class Estimate:
    """A mean over ``n`` examples with its confidence interval (``low``/``high`` None when n < 2)."""

    mean: float
    low: float | None
    high: float | None
    n: int

    @property
    def half_width(self) -> float | None:
        return None if self.low is None else (self.high - self.low) / 2


def stable_seed(*parts: object, bits: int = 63) -> int:
    """A seed from the parts' text (SHA-256; independent of PYTHONHASHSEED and of the order of work).

    ``x`` = the first 8 digest bytes, little-endian. ``bits=63``: ``x >> 1`` (Monte-Carlo masks);
    ``bits=31``: ``x mod 2**31`` (the per-unit attribution seed of ``evaluate``, as every store holds it).
    """
    x = int.from_bytes(hashlib.sha256("\x1f".join(map(str, parts)).encode()).digest()[:8], "little")
    return x >> 1 if bits == 63 else x & ((1 << bits) - 1)


def mc_standard_error(samples: np.ndarray) -> np.ndarray:
    """Standard error of the mean over the last axis, ``std(ddof=1) / sqrt(S)``; NaN for one sample."""
    samples = np.asarray(samples, dtype=np.float64)
    if samples.shape[-1] < 2:
        return np.full(samples.shape[:-1], np.nan)
    return sps.sem(samples, axis=-1, ddof=1)


def _arrays(strata: Strata) -> list[np.ndarray]:
    return [np.array([strata[s][e] for e in sorted(strata[s])], dtype=np.float64) for s in sorted(strata)
            if strata[s]]


def stratified_mean(*samples: np.ndarray, axis: int = -1) -> np.ndarray:
    """Mean over strata of the per-stratum means (the statistic of every table cell)."""
    return np.mean([np.mean(x, axis=axis) for x in samples], axis=0)


def estimate(strata: Strata, n_resamples: int = RESAMPLES, seed: int = SEED,
             confidence: float = CONFIDENCE) -> Estimate:
    """Mean over strata of per-stratum means, with a BCa bootstrap interval resampling within strata.

    ``scipy.stats.bootstrap`` resamples each stratum independently (``paired=False``), which is the
    stratified bootstrap of the Avg row. Where BCa is undefined (e.g. a resampled statistic that
    never varies on one side) the percentile interval of the same resamples is used; a constant
    sample gives a zero-width interval. No interval below two examples in any stratum.
    """
    samples = _arrays(strata)
    if not samples:
        raise ValueError("no values to estimate")
    mean = math.fsum(math.fsum(x) / len(x) for x in samples) / len(samples)
    n = sum(len(x) for x in samples)
    if min(len(x) for x in samples) < 2:
        return Estimate(mean, None, None, n)
    if all(np.ptp(x) == 0 for x in samples):
        return Estimate(mean, mean, mean, n)
    kwargs = dict(statistic=stratified_mean, vectorized=True, confidence_level=confidence, axis=-1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", sps.DegenerateDataWarning)
        res = sps.bootstrap(samples, n_resamples=n_resamples, rng=np.random.default_rng(seed), **kwargs)
        low, high = res.confidence_interval
        if not (np.isfinite(low) and np.isfinite(high)):
            res = sps.bootstrap(samples, n_resamples=0, bootstrap_result=res, method="percentile", **kwargs)
            low, high = res.confidence_interval
    return Estimate(mean, float(low), float(high), n)


def _paired(a: Strata, b: Strata) -> tuple[np.ndarray, np.ndarray]:
    """Values of the (stratum, example) pairs both hold, scaled so their mean difference is the
    difference of the two stratified means: weight ``1 / (strata * n_stratum)`` times the pair count."""
    keys = [(s, e) for s in sorted(set(a) & set(b)) for e in sorted(set(a[s]) & set(b[s]))]
    counts = {s: sum(1 for t, _ in keys if t == s) for s, _ in keys}
    weights = np.array([len(keys) / (len(counts) * counts[s]) for s, _ in keys])
    x = np.array([a[s][e] for s, e in keys], dtype=np.float64)
    y = np.array([b[s][e] for s, e in keys], dtype=np.float64)
    return x * weights, y * weights


def mean_difference(x: np.ndarray, y: np.ndarray, axis: int = -1) -> np.ndarray:
    return np.mean(x - y, axis=axis)


def paired_test(a: Strata, b: Strata, n_resamples: int = PERMUTATIONS, seed: int = SEED) -> float | None:
    """Two-sided p-value of a paired permutation (sign-flip) test of ``mean(a) - mean(b)`` = 0.

    Pairs are the examples both hold; under H0 each per-example difference is symmetric about 0, so
    swapping the two values of a pair does not change the distribution. ``scipy.stats.permutation_test``
    enumerates all ``2**n`` flips when that is at most ``n_resamples`` (exact test). None below 2 pairs.
    """
    x, y = _paired(a, b)
    if len(x) < 2:
        return None
    if np.array_equal(x, y):
        return 1.0
    res = sps.permutation_test((x, y), mean_difference, permutation_type="samples", vectorized=True,
                               n_resamples=n_resamples, alternative="two-sided", axis=-1,
                               rng=np.random.default_rng(seed))
    return float(res.pvalue)


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values: ``p_(i) -> max_{j <= i} min(1, (m - j + 1) p_(j))`` in sorted
    order (family-wise error <= alpha for any dependence between the tests)."""
    p = np.asarray(pvalues, dtype=np.float64)
    order = np.argsort(p, kind="stable")
    stepped = np.minimum(1.0, (len(p) - np.arange(len(p))) * p[order])
    adjusted = np.empty_like(p)
    adjusted[order] = np.maximum.accumulate(stepped)
    return adjusted.tolist()


@dataclass(frozen=True)
class Ranking:
    """Ranks (1 = best) by significance, and the Holm-adjusted p-value of each method vs the next one."""

    ranks: dict[str, int]
    order: list[str]  # best first
    p_next: list[float | None]  # adjusted p of order[i] vs order[i + 1]


def significance_ranks(cells: Mapping[str, Strata], means: Mapping[str, float], higher: bool,
                       alpha: float = ALPHA, n_resamples: int = PERMUTATIONS, seed: int = SEED) -> Ranking:
    """Dense ranks over the methods of one row: sorted by mean (ties by label), a method gets the next
    rank only where its paired test against the method before it is significant at ``alpha`` after
    Holm's adjustment across the row's adjacent comparisons; otherwise it shares that method's rank."""
    order = sorted(means, key=lambda k: (-means[k] if higher else means[k], k))
    raw = [paired_test(cells[a], cells[b], n_resamples, seed) for a, b in zip(order, order[1:], strict=False)]
    tested = [i for i, p in enumerate(raw) if p is not None]
    adjusted: list[float | None] = [None] * len(raw)
    for i, p in zip(tested, holm([raw[i] for i in tested]), strict=True):
        adjusted[i] = p
    ranks, rank = {}, 1
    for i, label in enumerate(order):
        if i and adjusted[i - 1] is not None and adjusted[i - 1] < alpha:
            rank += 1
        ranks[label] = rank
    return Ranking(ranks, order, adjusted)


def pearson_columns(pred: np.ndarray, gold: np.ndarray) -> np.ndarray:
    """Pearson's r of each column of ``pred`` ``(..., n, K)`` with ``gold`` ``(..., n)``: ``(..., K)``."""
    p = pred - pred.mean(-2, keepdims=True)
    y = (gold - gold.mean(-1, keepdims=True))[..., None]
    with np.errstate(invalid="ignore", divide="ignore"):
        return (p * y).sum(-2) / np.sqrt((p * p).sum(-2) * (y * y).sum(-2))


def pearson_curve(outputs, gold, x: Sequence, resamples: int = RESAMPLES, seed: int = 0) -> dict:
    """Pearson's r of each column of ``outputs`` ``(n, len(x))`` with ``gold`` ``(n,)`` (paper 003's Acc of a
    regression head at each perturbation ratio, eqs. 6 and 8), with its 95% percentile bootstrap interval over the
    n examples (``seed``): ``{"x", "values", "low", "high"}``."""
    pred, y = np.asarray(outputs, dtype=np.float64), np.asarray(gold, dtype=np.float64)
    rows = np.random.default_rng(seed).integers(0, len(y), size=(resamples, len(y)))
    boot = pearson_columns(pred[rows], y[rows])
    return {"x": list(x), "values": pearson_columns(pred, y).tolist(),
            "low": np.nanquantile(boot, 0.025, axis=0).tolist(), "high": np.nanquantile(boot, 0.975, axis=0).tolist()}
