"""Soft-NC / Soft-NS and pi-Soft-NC / pi-Soft-NS (paper 000 sec. 3.1, eqs. 1-7; docs/faithfulness.md).

For one generation step with retain probabilities ``s`` over the m content tokens:

* soft perturbation (eq. 1): ``x'_i = e_i x_i`` with ``e_i ~ Bernoulli(s_i)`` (NS) or ``Bernoulli(1 - s_i)``
  (NC), applied to the content-span embeddings only;
* effect (eqs. 2-3): Hellinger distance between the clean and perturbed next-token distributions;
* Soft-NS (eq. 4) = ``max(0, D0 - D(X')) / D0``, Soft-NC (eq. 5) = ``D(X-bar') / D0`` (may exceed 1),
  with ``D0`` the effect of the zero baseline (every content embedding zeroed), averaged over
  Monte-Carlo samples;
* pi-Soft-NC/NS (eq. 7): the same on ``s**alpha`` with ``alpha`` such that ``mean(s**alpha) = pi``.

``mode="reagent"`` reproduces the original ReAGent evaluator code instead: one Bernoulli draw per
embedding dimension, a single sample, and the distance ``sum_v (sqrt p_v - sqrt q_v)**2 / sqrt 2``.

Masks are coupled by default (common random numbers): for one (example, step, pi, sample) every method
uses the same uniforms ``u_i``; NS keeps token i when ``u_i < s_i``, NC when ``u_i >= s_i`` (NC's mask is
the complement of NS's). Each marginal is still Bernoulli(``s_i``) / Bernoulli(``1 - s_i``), so every
method's expected metric is unchanged, while the Monte-Carlo noise of a *difference* between methods
shrinks. ``coupling="independent"`` draws per method and per family (the earlier behaviour).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field

from ..checks import ROUTINGS, one_of, positive_int
from ..declarations import RETAIN_RULE, FigureSpec, MetricRow, TableSpec
from ..errors import LlmattrError
from ..explanation import Explanation
from ..lazy import torch
from ..models.loading import LoadedModel
from ..scores import check_finite
from ..stats import mc_standard_error, stable_seed
from ..store import Row
from ..targets import Target, visible
from .engine import PerturbationEngine
from .inputs import (
    check_explanation,
    check_scope,
    check_tokenizer,
    evaluated_steps,
    example_key,
    target_from_explanation,
)
from .registry import Metric, MetricContext, Option, register

PI_GRID = tuple(round(0.05 * i, 2) for i in range(1, 20))  # 0.05, 0.10, ..., 0.95 (paper 000 sec. 4.3)
ALPHA_TOL = 1e-4
D0_MIN = 1e-6  # below this the zero baseline does not move the output: Soft-NC/NS are undefined
MODES = ("paper", "reagent")
OUTPUTS = ("pi-soft-nc", "pi-soft-ns", "soft-nc", "soft-ns")  # the pi-soft metric's parts, by family
COUPLINGS = ("coupled", "independent")
LOG_ALPHA_RANGE = (-60.0, 60.0)  # beta = alpha L in [1e-26, 1e26]: every pi strictly inside the reachable limits

# the options of the soft metrics (pi-soft and soft read all three: one declaration each, :class:`Option`)
SAMPLES = Option("samples", 15, "Monte-Carlo samples per pi", positive=True)
STEP_STRIDE = Option("step_stride", 5, "Open generation: evaluate every k-th step", positive=True)
COUPLING = Option("coupling", "coupled", "Soft-metric masks: coupled, every method perturbed with the same random "
                  "numbers, or independent, a stream per method", valid=COUPLINGS)
SOFT_OPTIONS = (SAMPLES, STEP_STRIDE, COUPLING)


# ---------------------------------------------------------------------------------------- distances
def hellinger(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Hellinger distance over the last axis (paper 000 eq. 3): ``||sqrt p - sqrt q||_2 / sqrt 2``."""
    return (p.sqrt() - q.sqrt()).pow(2).sum(-1).sqrt() / math.sqrt(2)


def reagent_distance(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """The distance of the ReAGent evaluator code: ``sum_v (sqrt p_v - sqrt q_v)**2 / sqrt 2`` (no root)."""
    return (p.sqrt() - q.sqrt()).pow(2).sum(-1) / math.sqrt(2)


DISTANCES = {"paper": hellinger, "reagent": reagent_distance}


# ---------------------------------------------------------------------------------------- pi and alpha
def check_pis(pis) -> torch.Tensor:
    """The pi grid as a float64 tensor; refuses values outside (0, 1) or a grid that does not increase."""
    grid = torch.as_tensor(PI_GRID if pis is None else list(pis), dtype=torch.float64).reshape(-1)
    if grid.numel() == 0 or not torch.isfinite(grid).all() or ((grid <= 0) | (grid >= 1)).any():
        raise LlmattrError("every pi must lie strictly between 0 and 1 (e.g. 0.05, 0.10, ..., 0.95)")
    if (grid.diff() <= 0).any():
        raise LlmattrError("the pi grid must be strictly increasing")
    return grid


def reachable(s: torch.Tensor) -> tuple[float, float]:
    """The limits of ``mean(s**alpha)`` over ``alpha`` in (0, inf): ``o/m`` as alpha grows (only the o exact 1s
    keep weight) and ``(m - z)/m`` as it falls to 0 (every token but the z exact 0s reaches 1)."""
    m = s.numel()
    return float((s == 1).sum()) / m, 1 - float((s == 0).sum()) / m


def alpha_search(s: torch.Tensor, pis: torch.Tensor, tol: float = ALPHA_TOL) -> torch.Tensor:
    """``alpha`` per pi with ``|mean(s**alpha) - pi| <= tol`` (paper 000 eq. 7) for pi strictly inside
    :func:`reachable`'s limits, by bisection on ``log alpha``, all pi at once (one tensor op per step); NaN for a
    pi outside them, where no alpha exists (:func:`transform` fills there).

    The search runs on ``log s_i / L``, ``L = max |log s_i|`` over the tokens with 0 < s_i < 1, i.e. on
    ``beta = alpha L``: ``s -> s**c`` scales every ``log s_i`` and ``L`` by ``c``, so the normalised values, the
    bisection's path and ``beta`` stay the same (to rounding) and ``alpha`` becomes ``alpha / c``, which is eq. 7's
    promise kept exactly rather than within the tolerance."""
    s, pis = s.double(), pis.double()
    lower, upper = reachable(s)
    inside = (pis > lower) & (pis < upper)
    inner = (s > 0) & (s < 1)
    if not bool(inner.any()):  # only 0s and 1s: the limits meet, every pi is filled
        return torch.full_like(pis, math.nan)
    log_s = s[inner].log()
    scale = -log_s.min()
    beta = _bisect(log_s / scale, pis.clamp(lower, upper), lower, s.numel(), tol, inside)
    return torch.where(inside, beta / scale, torch.full_like(pis, math.nan))


def _bisect(normalised: torch.Tensor, pis: torch.Tensor, ones: float, m: int, tol: float,
            inside: torch.Tensor) -> torch.Tensor:
    """``beta`` per pi with ``|ones + sum_i exp(beta normalised_i) / m - pi| <= tol`` wherever ``inside``: the
    mean of ``s**alpha`` over the m tokens, the exact 1s (share ``ones``) and 0s apart (:func:`alpha_search`)."""
    lo = torch.full_like(pis, LOG_ALPHA_RANGE[0])
    hi = torch.full_like(pis, LOG_ALPHA_RANGE[1])
    for _ in range(200):
        mid = (lo + hi) / 2
        error = torch.where(inside, ones + (mid.exp()[:, None] * normalised).exp().sum(-1) / m - pis, 0.0)
        if error.abs().max() <= tol:
            return mid.exp()
        too_high = error > 0  # mean(s**alpha) above pi: alpha must grow
        lo, hi = torch.where(too_high, mid, lo), torch.where(too_high, hi, mid)
    raise LlmattrError(f"alpha search did not reach pi within {tol} (max error {error.abs().max():.2e})")


def transform(s: torch.Tensor, pis: torch.Tensor, tol: float = ALPHA_TOL) -> torch.Tensor:
    """``(K, m)`` retain probabilities ``s~`` with ``mean(s~) = pi`` for each pi (paper 000 eq. 7; the reading of
    docs/faithfulness.md, "Retain probabilities").

    Strictly between :func:`reachable`'s limits ``o/m < pi < (m - z)/m``: ``s**alpha`` (:func:`alpha_search`; 0
    stays 0, 1 stays 1). At or above the alpha -> 0 limit: every nonzero token kept with probability 1 and each of
    the z zero tokens with ``q = (pi m - (m - z)) / z``. At or below the alpha -> inf limit: each of the o one-tokens
    with ``pi m / o``, every other with 0. No clip and no constant: continuous in pi (each fill meets the limit of
    ``s**alpha`` at its end), monotone in s, every pi in (0, 1) reached, invariant under ``s -> s**c``."""
    s, pis = s.double(), pis.double()
    m = s.numel()
    lower, upper = reachable(s)
    zero, one = s == 0, s == 1
    powered = s[None] ** alpha_search(s, pis, tol).nan_to_num(1.0)[:, None]
    fill_zeros = torch.where(zero[None], ((pis * m - (m - zero.sum())) / zero.sum().clamp_min(1))[:, None], 1.0)
    fill_ones = torch.where(one[None], (pis * m / one.sum().clamp_min(1))[:, None], 0.0)
    return torch.where((pis >= upper)[:, None], fill_zeros, torch.where((pis <= lower)[:, None], fill_ones, powered))


# ---------------------------------------------------------------------------------------- Monte Carlo
def mc_seed(seed: int, example: str, step: int, method: str | None = None) -> int:
    """A 63-bit generator seed for one (example, step[, method]), derived from the user's ``seed``.

    Coupled masks leave out the method (every method draws the same uniforms); independent ones
    include it.
    """
    return stable_seed(*((seed, example, step) if method is None else (seed, example, step, method)))


def draw_masks(s_tilde: torch.Tensor, samples: int, generator: torch.Generator, families=("ns", "nc"),
               dims: int | None = None, coupling: str = "coupled") -> dict[str, torch.Tensor]:
    """Keep masks ``(K, samples, m)`` (``(K, samples, m, dims)`` per dimension, ReAGent) per family.

    ``coupled``: one set of uniforms u; NS keeps ``u < s`` (P = s), NC keeps ``u >= s`` (P = 1 - s), the
    complement. ``independent``: fresh uniforms per family, NS ``u < s`` and NC ``u' < 1 - s``.
    """
    k, m = s_tilde.shape
    shape = (k, samples, m) if dims is None else (k, samples, m, dims)
    s = s_tilde[:, None, :] if dims is None else s_tilde[:, None, :, None]
    if coupling == "coupled":
        u = torch.rand(shape, generator=generator, dtype=torch.float64)
        keep = {"ns": u < s, "nc": u >= s}
    else:
        keep = {"ns": None, "nc": None}
        for family, p in (("ns", s), ("nc", 1 - s)):
            if family in families:
                keep[family] = torch.rand(shape, generator=generator, dtype=torch.float64) < p
    return {f: keep[f].float() for f in ("ns", "nc") if f in families}


@dataclass
class StepSamples:
    """Per-sample metric values of one step, on the CPU whatever the model's device: ``ns``/``nc`` are ``(K, samples)``
    or None if not requested."""

    d0: float
    ns: torch.Tensor | None
    nc: torch.Tensor | None


def soft_samples(engine: PerturbationEngine, s_tilde: torch.Tensor, samples: int, generator: torch.Generator,
                 families: tuple[str, ...] = ("ns", "nc"), mode: str = "paper",
                 coupling: str = "coupled", groups: torch.Tensor | None = None) -> StepSamples:
    """Soft-NS (eq. 4) and Soft-NC (eq. 5) per Monte-Carlo sample for each row of ``s_tilde`` (K, m).

    Every perturbed input (the zero baseline, then the NS masks, then the NC masks) goes through
    ``engine.probs`` in one call. NS keeps token i with probability ``s_i`` (eq. 1), NC with ``1 - s_i``
    (:func:`draw_masks`). With ``groups`` ``(m, n_span)`` (0/1: which span tokens form each of the m units, e.g.
    the sources), the Bernoulli draws are per unit and a unit's tokens are kept or zeroed together; tokens of no
    unit are never perturbed (the zero baseline zeroes every unit). Over units the masks come from ``2^m``
    possibilities, so each one's probabilities are kept on the model and the next method's same mask is read
    back (:meth:`PerturbationEngine.probs` with ``reuse``); token masks are not kept.
    """
    dims = engine.suffix_embeds.shape[-1] if mode == "reagent" else None
    k, m = s_tilde.shape
    masks = draw_masks(s_tilde, samples, generator, families, dims, coupling)
    zero = torch.zeros((1, m) if dims is None else (1, m, dims))
    batch = torch.cat([zero] + [mask.flatten(0, 1) for mask in masks.values()])
    if groups is not None:
        batch = 1 - (1 - batch) @ groups.float()
    probs = engine.probs(batch, reuse=groups is not None)  # masks over units repeat across methods: kept
    distance = DISTANCES[mode](engine.clean_probs.double()[None], probs.double()).cpu()  # (1 + F K S,)
    d0, rest = float(distance[0]), distance[1:].reshape(len(masks), k, samples)
    if d0 <= D0_MIN:
        return StepSamples(d0=d0, ns=None, nc=None)
    per = dict(zip(masks, rest, strict=True))
    ns = (d0 - per["ns"]).clamp_min(0) / d0 if "ns" in per else None
    nc = per["nc"] / d0 if "nc" in per else None
    return StepSamples(d0=d0, ns=ns, nc=nc)


# ---------------------------------------------------------------------------------------- results
def curve_auc(values: torch.Tensor, pis: list[float]) -> torch.Tensor:
    """Trapezoid area under the curve(s) along the first axis divided by the span of the grid (the pi grid;
    the ranking metrics' fractions 0..1, whose span is 1), so the AUC reads on the metric's own scale."""
    if len(pis) == 1:
        return values[0]
    return torch.trapezoid(values, torch.tensor(pis, dtype=torch.float64), dim=0) / (pis[-1] - pis[0])


def auc(pis: list[float], values: list[float]) -> float:
    """Trapezoid area under the pi-curve divided by the span of the grid (reads on the metric's scale)."""
    return float(curve_auc(torch.tensor(values, dtype=torch.float64), pis))


@dataclass(repr=False)
class SoftResult:
    """pi-curves, their AUCs, the original Soft-NC/NS (alpha = 1) and E[R], averaged over the steps."""

    pis: list[float]
    pi_soft_ns: list[float] | None
    pi_soft_nc: list[float] | None
    soft_ns: float | None
    soft_nc: float | None
    expected_retained: float
    routing: str
    samples: int
    seed: int
    mode: str
    steps: list[int] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    coupling: str = "coupled"
    mc_se: dict = field(default_factory=dict)  # Monte-Carlo standard error of each value (None: 1 sample)
    draws: dict = field(default_factory=dict)  # each scalar value's per-sample draws (:func:`mc_draws`)
    d0: float | None = None  # mean zero-baseline distance D0 over the evaluated steps
    scope: str = "span"  # what was perturbed and zeroed (the explanation's scope)

    def __repr__(self) -> str:
        """One line: the AUCs, Soft-NS/NC and E[R] (``to_dict()`` has the curves)."""
        values = {"auc_ns": self.auc_ns, "auc_nc": self.auc_nc, "soft_ns": self.soft_ns, "soft_nc": self.soft_nc,
                  "expected_retained": self.expected_retained}
        shown = ", ".join(f"{key}={value:.4f}" for key, value in values.items() if value is not None)
        return f"SoftResult({shown}; {self.routing} routing, {self.samples} samples, {len(self.pis)} pis)"

    @property
    def auc_ns(self) -> float | None:
        return None if self.pi_soft_ns is None else auc(self.pis, self.pi_soft_ns)

    @property
    def auc_nc(self) -> float | None:
        return None if self.pi_soft_nc is None else auc(self.pis, self.pi_soft_nc)

    def _curve(self, values: list[float] | None) -> dict | None:
        return None if values is None else {"x": list(self.pis), "values": list(values),
                                            "auc": auc(self.pis, values)}

    def to_dict(self) -> dict:
        return {
            "metrics": {
                "pi_soft_ns": self._curve(self.pi_soft_ns), "pi_soft_nc": self._curve(self.pi_soft_nc),
                "soft_ns": self.soft_ns, "soft_nc": self.soft_nc, "expected_retained": self.expected_retained,
            },
            "routing": self.routing, "samples": self.samples, "seed": self.seed, "mode": self.mode,
            "coupling": self.coupling, "d0": self.d0, "scope": self.scope, "mc_se": dict(self.mc_se),
            "warnings": list(self.warnings),
        }


def families_of(metrics) -> tuple[str, ...]:
    """Which perturbation families ('ns', 'nc') the requested metric names need."""
    names = [metrics] if isinstance(metrics, str) else list(metrics)
    unknown = [name for name in names if name not in OUTPUTS]
    if unknown or not names:
        raise LlmattrError(f"unknown soft metric {unknown or names!r}; valid: {', '.join(OUTPUTS)}")
    return tuple(f for f in ("ns", "nc") if any(name.endswith(f) for name in names))


def check_scores(scores: torch.Tensor, target: Target, units: int | None = None) -> torch.Tensor:
    """Retain probabilities ``(n_steps, m)`` in [0, 1] matching the target's steps and content span (or ``units``
    columns: one per source)."""
    m = target.span[1] - target.span[0] if units is None else units
    if scores.dim() != 2 or tuple(scores.shape) != (target.n_steps, m):
        what = "span tokens" if units is None else "sources"
        raise LlmattrError(
            f"scores have shape {tuple(scores.shape)}, expected ({target.n_steps} steps, {m} {what})"
        )
    check_finite(scores)
    if ((scores < 0) | (scores > 1)).any():
        raise LlmattrError("scores must be retain probabilities in [0, 1]; map raw scores with "
                           "llmattr.scores.retain_probs first")
    return scores.double()


def evaluate_target(lm: LoadedModel, target: Target, scores: torch.Tensor, steps: list[int],
                    metrics=("pi-soft-nc", "pi-soft-ns"), routing: str = "dynamic", samples: int = SAMPLES.default,
                    seed: int = 0, pis=None, mode: str = "paper", example: str = "", method: str = "",
                    batch_size: int | None = None, coupling: str = COUPLING.default,
                    groups: torch.Tensor | None = None) -> SoftResult:
    """pi-Soft-NC/NS (eq. 7) and Soft-NC/NS (alpha = 1) of ``scores`` at ``steps``, averaged over steps.

    ``scores``: retain probabilities ``(n_steps, m)``. Masks are drawn from a generator seeded per
    (``example``, step) from ``seed`` (:func:`mc_seed`; per (example, step, ``method``) with
    ``coupling="independent"``), so reruns are bit-identical. ``mode="reagent"`` uses a single
    per-dimension draw (``samples`` becomes 1). ``result.mc_se`` holds the Monte-Carlo standard error of
    every value (:func:`mc_errors`). ``groups`` ``(n_units, n_span)``: the scores are per unit (a source's
    tokens masked together, :func:`soft_samples`), ``(n_steps, n_units)``.
    """
    if mode not in MODES:
        raise LlmattrError(f"unknown mode {mode!r}; use 'paper' or 'reagent'")
    if groups is not None and mode != "paper":
        raise LlmattrError("scores per source take mode 'paper' (ReAGent's masks are per embedding dimension)")
    one_of(coupling, COUPLINGS, "coupling")
    if samples < 1:
        raise LlmattrError("samples must be at least 1")
    families = families_of(metrics)
    grid = check_pis(pis)
    scores = check_scores(scores, target, None if groups is None else groups.shape[0])
    samples = 1 if mode == "reagent" else samples
    warnings, kept, per_step = [], [], []
    for step in steps:
        engine = PerturbationEngine(lm, target, step=step, routing=routing, batch_size=batch_size)
        s = scores[step, : engine.n_span] if groups is None else scores[step]  # scope "all": the tokens it sees
        s_tilde = torch.cat([transform(s, grid), s[None]])  # K pi rows, then alpha = 1
        generator = torch.Generator().manual_seed(
            mc_seed(seed, example, step, method if coupling == "independent" else None))
        result = soft_samples(engine, s_tilde, samples, generator, families, mode, coupling, groups)
        if result.ns is None and result.nc is None:
            warnings.append(f"step {step}: the zero baseline does not change the output (D0 = {result.d0:.1e}); "
                            "Soft-NC/NS undefined, step skipped")
            continue
        kept.append(step)
        per_step.append(result)
    if not kept:
        raise LlmattrError("the zero baseline does not change the model's output at any evaluated step (D0 = 0): "
                           "Soft-NC/NS are undefined for this input")

    def mean_curve(name: str) -> torch.Tensor | None:
        rows = [getattr(r, name) for r in per_step]
        return None if rows[0] is None else torch.stack(rows).mean(-1).mean(0)  # samples, then steps

    ns, nc = mean_curve("ns"), mean_curve("nc")
    return SoftResult(
        pis=grid.tolist(),
        pi_soft_ns=None if ns is None else ns[:-1].tolist(), pi_soft_nc=None if nc is None else nc[:-1].tolist(),
        soft_ns=None if ns is None else float(ns[-1]), soft_nc=None if nc is None else float(nc[-1]),
        expected_retained=float(sum(float(scores[k, : visible(target, k) if groups is None else None].sum())
                                    for k in kept) / len(kept)),
        routing=routing, samples=samples, seed=seed, mode=mode, steps=kept, warnings=warnings,
        coupling=coupling, mc_se=mc_errors(per_step, grid.tolist()), draws=mc_draws(per_step, grid.tolist()),
        d0=float(sum(r.d0 for r in per_step) / len(per_step)), scope=target.scope,
    )


def sample_values(per_step: list[StepSamples], pis: list[float]
                  ) -> Iterator[tuple[str, torch.Tensor, torch.Tensor]]:
    """``(family, curves (T, K + 1, S), aucs (T, S))`` of each family the steps measured: every sample's curve
    (the K pi rows, then alpha = 1) and its AUC per step. The AUC is linear in the curve, so sample j's AUC (over
    the pi rows of sample j) is one draw of it."""
    for family in ("ns", "nc"):
        rows = [getattr(r, family) for r in per_step]
        if rows[0] is not None:
            curves = torch.stack(rows)
            yield family, curves, curve_auc(curves[:, :-1].transpose(0, 1), pis)


def mc_errors(per_step: list[StepSamples], pis: list[float]) -> dict:
    """Monte-Carlo standard error of every reported value (None with one sample).

    A value is the mean over T steps of a mean over S samples; steps draw independently, so its error
    is ``sqrt(sum_t se_t**2) / T`` with ``se_t`` the standard error over samples at step t.
    """
    out: dict = {}
    for family, curves, aucs in sample_values(per_step, pis):
        per_step_se = mc_standard_error(torch.cat([curves, aucs[:, None]], 1).numpy())  # (T, K + 2)
        se = [None if math.isnan(v) else v for v in ((per_step_se ** 2).sum(0) ** 0.5 / len(curves)).tolist()]
        out.update({f"pi_soft_{family}": se[:-2], f"soft_{family}": se[-2], f"pi_soft_{family}_auc": se[-1]})
    return out


def mc_draws(per_step: list[StepSamples], pis: list[float]) -> dict[str, list[float]]:
    """Each scalar value's Monte-Carlo draws: sample j's Soft-NS/NC and its pi-curve's AUC, averaged over the
    steps (the value is their mean). Two results drawn from the same uniforms (the same seed, example and steps;
    the scores may differ) pair their draws j, so the error of their difference is the standard error of the
    paired differences (:func:`llmattr.stats.mc_standard_error`), not the two errors added as if independent."""
    out: dict = {}
    for family, curves, aucs in sample_values(per_step, pis):
        out.update({f"soft_{family}": curves[:, -1].mean(0).tolist(), f"pi_soft_{family}_auc": aucs.mean(0).tolist()})
    return out


# ---------------------------------------------------------------------------------------- explanations
def evaluate_explanation(explanation: Explanation, lm: LoadedModel,
             metrics=("pi-soft-nc", "pi-soft-ns"), routing: str = "dynamic", samples: int = SAMPLES.default,
             seed: int = 0, pis=None, step_stride: int = STEP_STRIDE.default, mode: str = "paper",
             batch_size: int | None = None, coupling: str = COUPLING.default, scope: str | None = None) -> SoftResult:
    """pi-Soft-NC/NS curves and AUCs, Soft-NC/NS (alpha = 1) and E[R] of an Explanation (paper 000 sec. 3.1).

    Args:
        explanation: scored with its retain probabilities (``Step.scores``).
        lm: the model it explains (:func:`llmattr.evaluate` also takes a spec).
        metrics: any of "pi-soft-nc", "pi-soft-ns", "soft-nc", "soft-ns" (NC and NS families).
        routing: "dynamic" (plain forward) or "fixed" (clean attention replayed, appendix K).
        samples: Monte-Carlo samples per pi (paper: 15); seed: one user seed, derived per
            (example, step) (and method, with ``coupling="independent"``).
        pis: the pi grid (default 0.05, 0.10, ..., 0.95).
        step_stride: generation tasks are evaluated every ``step_stride``-th step and averaged.
        mode: "paper" (token masks, Hellinger, MC average) or "reagent" (the original code's reading).
        coupling: "coupled" (every method perturbed with the same uniforms: common random numbers) or
            "independent" (a stream per method, the earlier behaviour).
        scope: what is perturbed and zeroed: always what the explanation attributes (its ``scope``);
            given, it must agree. Default: the explanation's scope, but ``"all"`` with ``mode="reagent"``
            (the ReAGent evaluator perturbs the prompt and the generated prefix).
    """
    check_explanation(explanation)
    positive_int(samples, "samples")
    positive_int(step_stride, "step_stride")
    one_of(routing, ROUTINGS, "routing")
    check_scope(explanation, scope, mode)
    target = target_from_explanation(explanation)
    check_tokenizer(explanation, lm)
    result = evaluate_target(
        lm, target, explanation.score_matrix(), evaluated_steps(explanation, step_stride), metrics=metrics,
        routing=routing, samples=samples, seed=seed, pis=pis, mode=mode, example=example_key(explanation),
        method=explanation.method, batch_size=batch_size, coupling=coupling,
    )
    if explanation.model != lm.model_id:
        result.warnings.append(f"explanation made with {explanation.model}, evaluated with {lm.model_id}")
    return result


def soft_options(ctx: MetricContext) -> dict:
    """The options the soft metrics read (the run's seed and their declared :data:`SOFT_OPTIONS`), as keywords of
    :func:`evaluate_explanation`."""
    return {"seed": ctx.options.seed, **{option.name: ctx.options.get(option.name) for option in SOFT_OPTIONS}}


def _rows(ctx: MetricContext, routing: str, curves: bool) -> list[Row]:
    """pi-Soft-NC/NS curves and AUCs (``curves``) or Soft-NC/NS at alpha = 1 and E[R] (eqs. 4-7) as store rows.

    Soft-NC/NS and E[R] come from a one-point grid, so ``soft`` costs 2 instead of 20 perturbation
    rows per sample; the two metric families never share rows, so either can be added to a store later.
    """
    result = evaluate_explanation(ctx.explanation, ctx.lm, metrics=("pi-soft-nc", "pi-soft-ns"), routing=routing,
                                  pis=None if curves else (0.5,), **soft_options(ctx))
    values, se, draws = result.to_dict()["metrics"], result.mc_se, result.draws
    if not curves:
        return [Row(name, values[name], se=se.get(name), draws=draws.get(name))
                for name in ("soft_ns", "soft_nc", "expected_retained")]
    rows = []
    for name in ("pi_soft_ns", "pi_soft_nc"):
        curve = values[name]
        rows += [Row(name, v, x=p, se=e) for p, v, e in zip(curve["x"], curve["values"], se[name], strict=True)]
        auc_name = f"{name}_auc"
        rows.append(Row(auc_name, curve["auc"], se=se[auc_name], draws=draws.get(auc_name)))
    return rows


def _result(ctx: MetricContext, routing: str, outputs: tuple[str, ...]) -> SoftResult:
    """``llmattr.evaluate``'s result for the soft metrics: one :func:`evaluate_explanation` of the asked families
    (``outputs``, default both), the curves and Soft-NC/NS (alpha = 1) together."""
    return evaluate_explanation(ctx.explanation, ctx.lm, metrics=outputs or ("pi-soft-nc", "pi-soft-ns"),
                                routing=routing, **soft_options(ctx), **ctx.keywords)


CURVE_ROWS = (MetricRow("pi_soft_ns", "π-Soft-NS", True), MetricRow("pi_soft_nc", "π-Soft-NC", True))
AUC_ROWS = (MetricRow("pi_soft_ns_auc", "AUC π-Soft-NS", True), MetricRow("pi_soft_nc_auc", "AUC π-Soft-NC", True))
register(Metric(
    "pi-soft", lambda ctx, routing: _rows(ctx, routing, curves=True),
    options=("seed",), declares=SOFT_OPTIONS, routed=True, outputs=OUTPUTS, result=_result, rules=(RETAIN_RULE,),
    keywords=("pis", "mode", "scope", "batch_size"),
    summary="pi-Soft-NC/NS curves over pi = 0.05..0.95 and their AUC (paper 000 eq. 7; Tables 1, 8)",
    tables=(TableSpec("table1_pi_soft_auc", "Table 1: AUC of π-Soft-NC/NS curves (dynamic routing)",
                      "Mean over examples of the per-example AUC (trapezoid / span of the π grid). "
                      "Ranks on the Avg row.", "datasets_by_methods", AUC_ROWS, "dynamic", order=10),
            TableSpec("table8_fixed_routing", "Table 8: AUC of π-Soft-NC/NS curves (fixed routing)",
                      "Attention probabilities cached from the clean input and replayed. Ranks on the Avg row.",
                      "datasets_by_methods", AUC_ROWS, "fixed", order=30)),
    figures=(FigureSpec("fig3_pi_curves", "π-Soft-NC/NS curves", "Mean curves with 95% bands", CURVE_ROWS,
                        "retaining probability pi", kind="pi_curves"),
             FigureSpec("fig5_layers", "Layer aggregation", "AUC of π-Soft-NS/NC vs the number of aggregated layers",
                        AUC_ROWS,
                        "number of aggregated layers", "dynamic", kind="layer_sweep"))))
register(Metric(
    "soft", lambda ctx, routing: _rows(ctx, routing, curves=False),
    options=("seed",), declares=SOFT_OPTIONS, routed=True,
    summary="original Soft-NC/NS (alpha = 1) and E[R] (paper 000 eqs. 4-5; Table 2)",
    tables=(TableSpec("table2_soft", "Table 2: original Soft-NC/NS and E[R] (dynamic routing)",
                      "No transformation of the scores (α = 1); E[R] = expected number of retained tokens.",
                      "metrics_by_methods",
                      (MetricRow("soft_ns", "Soft-NS", True), MetricRow("soft_nc", "Soft-NC", True),
                       MetricRow("expected_retained", "E[R]", False, ".1f")), "dynamic", order=20),)))
