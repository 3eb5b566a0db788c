"""The report's "can this run be trusted" section (docs/trust.md): which methods pass the sanity checks, how
reliable each metric was on this run, and the random control's place. Built from the stored rows of the
``model-randomization``, ``data-randomization`` and ``reliability`` metrics only; a run without them has no such
section (the rest of the report is unchanged).

* **Sanity checks** (one row per method): Spearman's rho with every block randomised (cascade, ``x = 0``), with the
  top block alone, the lowest rho of a single randomised block, and against the permuted-label model; a method
  **fails** where the 95% interval of the all-blocks or the data rho lies above :data:`FAIL_RHO`.
* **Reliability** (one row per metric value ``v``; MetaQuantus, Hedström et al. 2023, adapted):

  - resilience to each minor perturbation ``p`` (another seed; ``s -> s**c``) = ``E|Delta_p| / SD(v)`` and
    reactivity to each disruptive one (shuffled; inverted scores) = the same, where ``Delta_p`` is the stored
    per-example shift and ``SD(v)`` the standard deviation of ``v`` over every (method, example) of the run; mean
    over examples with its 95% bootstrap interval (lower is better for resilience, higher for reactivity);
  - agreement: Kendall's tau-b between ``v``'s ranking of the methods (controls left out, each value's direction
    applied) and every other value's, averaged; the interval resamples examples (paired across methods);
  - split-half stability: tau-b between the rankings of two random halves of the examples, over
    :data:`SPLITS` splits (mean and 2.5-97.5% percentiles);
  - the random control's rank among all methods (1 = best).
* Under the reliability table, paper 000's claim: ``|Delta|`` under ``s -> s**c`` beside its Monte-Carlo error
  for the values stored with one (pi-Soft AUCs, Soft-NC/NS).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping, Sequence

import numpy as np

from .. import stats
from ..declarations import DISRUPTIVE, FAIL_RHO, MINOR, PERTURBED_SEP, UNPERTURBED, MetricRow
from ..store import NONE, Results
from .model import Cell, Section, Stats, Table, cell_text, is_control, method_order
from .queries import example_values, layer_values, per_example

SPLITS = 200  # random halvings for split-half stability, and bootstrap resamples of the agreement (seeded)
ROUTING = "none"  # the trust metrics are stored once per explanation (not per routing)
EXPECTED = ("Adebayo et al. 2018: a method whose scores barely change when the model's weights are randomised "
            "explains nothing about the model. Random does not read the model: it must fail (rho = 1).")


def tau_b(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Kendall's tau-b over the last axis: ``sum_{i<j} sign(x_i - x_j) sign(y_i - y_j) / sqrt(T_x T_y)`` with
    ``T`` the number of untied pairs of each (NaN where one has none); batched over the leading axes."""
    dx = np.sign(x[..., :, None] - x[..., None, :])
    dy = np.sign(y[..., :, None] - y[..., None, :])
    upper = np.triu(np.ones(dx.shape[-2:], dtype=bool), 1)
    num = (dx * dy)[..., upper].sum(-1)
    den = np.sqrt(np.abs(dx)[..., upper].sum(-1) * np.abs(dy)[..., upper].sum(-1))
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(den > 0, num / np.where(den > 0, den, 1), np.nan)


def pooled(values: Mapping[tuple, Mapping[str, float]], labels: Sequence[str]) -> stats.Strata:
    """``{dataset: {"<label>/<example>": value}}`` of the ``labels``' values: every (method, example) of a
    dataset is one draw of the bootstrap."""
    out: dict = defaultdict(dict)
    for (dataset, label), examples in values.items():
        if label in labels:
            for example, value in examples.items():
                out[dataset][f"{label}/{example}"] = value
    return dict(out)


def estimate_cell(strata: stats.Strata, cfg: Stats, fmt: str = ".3f") -> Cell:
    if not any(strata.values()):
        return Cell(None, "–")
    est = stats.estimate(strata, cfg.resamples, cfg.seed)
    return Cell(est.mean, cell_text(est, fmt), estimate=est)


# ----------------------------------------------------------------------------------------------- sanity checks
def verdict(cells: Sequence[Cell]) -> str:
    """``fails`` where a cell's interval (its mean, below two examples) lies above :data:`FAIL_RHO`, ``passes``
    where some cell exists and none does, ``–`` without any."""
    shown = [c.estimate for c in cells if c.estimate is not None]
    if not shown:
        return "–"
    return "fails" if any((e.low if e.low is not None else e.mean) > FAIL_RHO for e in shown) else "passes"


def sanity_table(results: Results, model: str, cfg: Stats) -> Table | None:
    """One row per method: rho with every block randomised, with the top block alone, the lowest single block's,
    against the permuted-label model, and the verdict."""
    cascade, layers = layer_values(results, model, "cascade_spearman", ROUTING)
    independent, _ = layer_values(results, model, "independent_spearman", ROUTING)
    data = example_values(results, model, "data_spearman", ROUTING)
    labels = method_order({label for _, label in [*cascade, *independent, *data]}, cfg.controls)
    if not labels:
        return None
    rows = []
    for label in labels:
        everything = estimate_cell(cascade.get((0, label), {}), cfg) if layers else Cell(None, "–")
        top = estimate_cell(cascade.get((layers[-1], label), {}), cfg) if layers else Cell(None, "–")
        singles = [estimate_cell(independent.get((layer, label), {}), cfg) for layer in layers]
        lowest = min((c for c in singles if c.value is not None), key=lambda c: c.value, default=Cell(None, "–"))
        permuted = estimate_cell(pooled(data, [label]), cfg)
        rows.append((label, [everything, top, lowest, permuted, Cell(None, verdict([everything, permuted]))]))
    top_name = f"top block ({layers[-1]})" if layers else "top block"
    return Table("table_trust_sanity", "Can this run be trusted? Sanity checks of the methods",
                 f"Spearman's rho between each method's scores on the trained model and on a randomised one (1: "
                 f"unchanged). A method fails where the 95% interval of rho with every block randomised, or against "
                 f"the permuted-label model, lies above {FAIL_RHO}. {EXPECTED}", "Method",
                 ["ρ all blocks random", f"ρ {top_name} random", "lowest ρ, one block random",
                  "ρ permuted-label model", "Verdict"],
                 [Section("Model and data randomisation", rows)], control=())


# ----------------------------------------------------------------------------------------------- reliability
def measured_values(results: Results, model: str) -> list[str]:
    """The values ``v`` with stored ``v|none`` rows."""
    suffix = f"{PERTURBED_SEP}{UNPERTURBED}"
    names = [name for name in results.metric_names(model, ROUTING) if name.endswith(suffix)]
    return [name.removesuffix(suffix) for name in names]


def method_matrix(base: Mapping[tuple, Mapping[str, float]], labels: Sequence[str]
                  ) -> tuple[np.ndarray, list[tuple[str, str]]]:
    """``(methods, examples)`` values over the (dataset, example) pairs every one of ``labels`` holds."""
    keys = None
    for label in labels:
        held = {(d, ex) for (d, lab), examples in base.items() if lab == label for ex in examples}
        keys = held if keys is None else keys & held
    keys = sorted(keys or ())
    return np.array([[base[(d, label)][ex] for d, ex in keys] for label in labels], dtype=np.float64), keys


def oriented_means(matrix: np.ndarray, keys: list[tuple[str, str]], higher: bool,
                   index: np.ndarray | None = None) -> np.ndarray:
    """Per method, the mean of the dataset means over the examples ``index`` picks (default: all), signed so
    that larger is better; batched when ``index`` is ``(B, n)``."""
    index = np.arange(len(keys)) if index is None else index
    datasets = np.array([d for d, _ in keys])[index]
    parts = []
    for d in sorted(set(datasets.ravel())):
        weight = datasets == d
        parts.append((matrix[:, index] * weight).sum(-1) / np.maximum(weight.sum(-1), 1))
    means = np.mean(parts, axis=0)
    return np.moveaxis(means if higher else -means, 0, -1)  # (..., methods)


def agreement(matrices: dict[str, tuple[np.ndarray, list]], directions: dict[str, bool], cfg: Stats
              ) -> dict[str, Cell]:
    """Mean tau-b of each value's ranking of the methods with every other value's, with a bootstrap interval
    over the examples all of them hold (resampled once for all values: paired)."""
    names = [v for v in matrices if matrices[v][0].shape[1] > 0]
    if len(names) < 2 or matrices[names[0]][0].shape[0] < 2:  # two values ranking at least two methods
        return {}
    common = sorted(set.intersection(*(set(matrices[v][1]) for v in names)))
    if len(common) < 2:
        return {}
    rng = np.random.default_rng(cfg.seed)
    draws = np.vstack([np.arange(len(common)), rng.integers(0, len(common), (SPLITS, len(common)))])
    means = {}
    for v in names:
        matrix, keys = matrices[v]
        position = {key: i for i, key in enumerate(keys)}
        columns = np.array([position[key] for key in common])
        means[v] = oriented_means(matrix[:, columns], common, directions[v], draws)  # (1 + SPLITS, methods)
    out = {}
    for v in names:
        taus = np.mean([tau_b(means[v], means[w]) for w in names if w != v], axis=0)
        out[v] = tau_cell(taus[0], taus[1:], len(common))
    return out


def tau_cell(point: float | None, draws: np.ndarray, n: int) -> Cell:
    """A tau (``None``: the mean of the ``draws``) with the 2.5-97.5% percentiles of its resampled ``draws``,
    leaving out undefined draws (NaN: a resample that ties every method); ``–`` where nothing is defined."""
    draws = draws[~np.isnan(draws)]
    point = float(np.mean(draws)) if point is None and draws.size else point
    if point is None or np.isnan(point) or not draws.size:
        return Cell(None, "–")
    low, high = np.percentile(draws, [2.5, 97.5])
    est = stats.Estimate(float(point), float(low), float(high), n)
    return Cell(est.mean, cell_text(est, ".2f"), estimate=est)


def split_half(matrix: np.ndarray, keys: list, higher: bool, cfg: Stats) -> Cell:
    """tau-b between the method rankings of two random halves of the examples, over :data:`SPLITS` halvings."""
    n = len(keys)
    if n < 4 or matrix.shape[0] < 2:
        return Cell(None, "–")
    rng = np.random.default_rng(cfg.seed)
    order = np.argsort(rng.random((SPLITS, n)), axis=1)
    first, second = order[:, : n // 2], order[:, n // 2: 2 * (n // 2)]
    taus = tau_b(oriented_means(matrix, keys, higher, first), oriented_means(matrix, keys, higher, second))
    return tau_cell(None, taus, n)


def random_rank(base: Mapping[tuple, Mapping[str, float]], labels: Sequence[str], higher: bool,
                controls: Sequence[str]) -> str:
    """``k/n``: the control's place among all ``n`` methods by mean value (1 = best), ``–`` without a control."""
    strata = {label: pooled(base, [label]).values() for label in labels}
    means = {label: float(stats.stratified_mean(*(np.array(list(ex.values())) for ex in strata[label])))
             for label in labels}
    ranked = sorted(means, key=lambda label: -means[label] if higher else means[label])
    places = [str(i + 1) for i, label in enumerate(ranked) if is_control(label, controls)]
    return f"{', '.join(places)}/{len(ranked)}" if places else "–"


def claim_note(results: Results, model: str, values: list[str], titles: Mapping[str, MetricRow]) -> list[str]:
    """Paper 000's claim measured: mean ``|Delta|`` under ``s -> s**c`` beside its Monte-Carlo standard error,
    and the share of examples within two standard errors, for the values stored with one."""
    parts = []
    for v in values:
        pairs = [(value, se) for *_, x, _step, value, se in results.values(model, f"{v}{PERTURBED_SEP}power", ROUTING)
                 if se is not None and x == NONE]
        if pairs:
            shift = math.fsum(abs(d) for d, _ in pairs) / len(pairs)
            error = math.fsum(se for _, se in pairs) / len(pairs)
            within = sum(abs(d) <= 2 * se for d, se in pairs) / len(pairs)
            title = titles[v].title if v in titles else v
            parts.append(f"{title} {shift:.4f} (MC SE {error:.4f}; {within:.0%} of {len(pairs)} within 2 SE)")
    return [f"Under s -> s^c (paper 000's claim: raw Soft-NC/NS move, π-Soft does not): mean |Δ| "
            f"{'; '.join(parts)}."] if parts else []


def reliability_table(results: Results, model: str, cfg: Stats, titles: Mapping[str, MetricRow]) -> Table | None:
    """One row per measured value: resilience (minor perturbations), reactivity (disruptive ones), agreement,
    split-half stability and the random control's rank."""
    order = {name: i for i, name in enumerate(titles)}
    values = sorted(measured_values(results, model), key=lambda v: (order.get(v, len(order)), v))
    if not values:
        return None
    bases = {v: example_values(results, model, f"{v}{PERTURBED_SEP}{UNPERTURBED}", ROUTING) for v in values}
    directions = {v: titles[v].higher if v in titles else True for v in values}
    labels = method_order({label for base in bases.values() for _, label in base}, cfg.controls)
    methods = [label for label in labels if not is_control(label, cfg.controls)]
    matrices = {v: method_matrix(bases[v], methods) for v in values}
    agree = agreement(matrices, directions, cfg)
    rows = []
    for v in values:
        spread = np.std([x for examples in bases[v].values() for x in examples.values()], ddof=1)
        cells = []
        for kind in (*MINOR, *DISRUPTIVE):
            shifts = per_example(results, model, f"{v}{PERTURBED_SEP}{kind}", ROUTING)
            scaled = {key: {ex: abs(sum(points.values()) / len(points)) / spread for ex, points in examples.items()}
                      for key, examples in shifts.items()} if spread > 0 else {}
            cells.append(estimate_cell(pooled(scaled, labels), cfg, ".2f"))
        cells += [agree.get(v, Cell(None, "–")), split_half(*matrices[v], directions[v], cfg),
                  Cell(None, random_rank(bases[v], labels, directions[v], cfg.controls))]
        title = titles[v].title if v in titles else v
        rows.append((f"{title} {'↑' if directions[v] else '↓'}", cells))
    return Table("table_trust_reliability", "Can this run be trusted? Reliability of the metrics",
                 "Resilience: E|Δ| / SD of the value under a perturbation that must not change it (another mask "
                 "seed; s -> s^c), lower is better; reactivity: the same under one that must (scores shuffled; "
                 "inverted), higher is better (MetaQuantus, adapted: docs/trust.md). Agreement: mean Kendall τ-b "
                 "of the value's ranking of the methods with every other value's; split-half: τ-b between the "
                 f"rankings of two random halves of the examples ({SPLITS} splits). Random's rank among all "
                 "methods, 1 = best.", "Metric",
                 [*(f"Resilience: {k}" for k in MINOR), *(f"Reactivity: {k}" for k in DISRUPTIVE), "Agreement τ",
                  "Split-half τ", "Random's rank"],
                 [Section("Reliability on this run", rows)], notes=claim_note(results, model, values, titles))


def trust_tables(results: Results, model: str, cfg: Stats, rows: Sequence[MetricRow]) -> list[Table | None]:
    """The trust section's tables (``rows``: the registered tables' value names, for titles and directions)."""
    titles = {row.metric: row for row in rows}
    return [sanity_table(results, model, cfg), reliability_table(results, model, cfg, titles)]
