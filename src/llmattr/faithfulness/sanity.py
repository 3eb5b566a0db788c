"""Sanity checks for attribution methods (Adebayo et al. 2018, "Sanity checks for saliency maps"; docs/trust.md).

An attribution that does not change when the model's weights are randomised, or when the model was trained on
random labels, explains nothing about the model. For one Explanation these metrics re-run its method (its name and
parameters) and compare the scores with Spearman's rank correlation over the content tokens,

    rho = Pearson(rank(a_trained), rank(a_random))      (average ranks for ties),

per evaluated step (classification: the label step; generation: every ``step_stride``-th step):

* ``model-randomization``: the method on the trained model against the method on the same model with the
  parameters of transformer blocks replaced by random draws, **cascading** from the top block down (row
  ``cascade_spearman``, ``x`` = the lowest randomised block: ``x = L - 1`` the top block alone, ``x = 0`` every
  block) and **independently** one block at a time (``independent_spearman``, ``x`` = the block);
* ``data-randomization``: the method on the evaluated model (fine-tuned on true labels) against the method on a
  model fine-tuned on permuted labels (``--permuted-model``; ``llmattr finetune --permute-labels``):
  ``data_spearman``.

Randomisation (:func:`randomized`) replaces every parameter tensor ``W`` of a block by ``mean(W) + std(W) * z``,
``z ~ N(0, 1)`` seeded per (seed, block), so a block gets the same random weights in both protocols and the scale
of each tensor is kept (a norm's all-ones weight, std 0, stays as it is); the originals are copied to the CPU and
written back exactly afterwards, and every result kept on the model (:mod:`llmattr.models.kept`) is forgotten on
the way in and out. The embeddings and the output head are never randomised. Both the trained and the randomised
scores are computed under one torch seed per example (:func:`attribution_seed`), so a stochastic method differs
only by the weights.

A method **fails** where the 95% interval of ``rho`` with every block randomised (``cascade_spearman`` at
``x = 0``; ``data_spearman``) lies above :data:`FAIL_RHO` (docs/trust.md gives the reason).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from functools import lru_cache

import numpy as np

from .. import methods
from ..checks import check_model_path
from ..declarations import FAIL_RHO, MetricRow, TableSpec
from ..errors import LlmattrError
from ..explanation import Explanation
from ..lazy import lazy, torch
from ..models.anatomy import decoder_blocks
from ..models.loading import LoadedModel, load_model
from ..stats import stable_seed
from ..store import Row
from .inputs import check_tokenizer, evaluated_steps, example_key, target_from_explanation
from .registry import Metric, MetricContext, Option, register
from .soft import STEP_STRIDE

sps = lazy("scipy.stats")

SANITY_STRIDE = Option("sanity_stride", 1, "Model randomisation: randomise every k-th block (the top block and "
                       "block 0 always)", positive=True)


def check_permuted_model(path: object) -> None:
    """``--permuted-model``'s check hook (data randomisation's option): a folder with ``config.json``, a .gguf or a
    hub id (empty: not given; data-randomization then asks for it), refused before any model loads."""
    if path:
        try:
            check_model_path(str(path))
        except LlmattrError as err:
            raise LlmattrError(f"--permuted-model: {err}") from None


PERMUTED_MODEL = Option("permuted_model", "", "Data randomisation: the model fine-tuned on permuted labels "
                        "(llmattr finetune --permute-labels), compared with the evaluated model",
                        validate=check_permuted_model)


def spearman(a: torch.Tensor, b: torch.Tensor) -> float | None:
    """Spearman's rho of two score vectors (average ranks for ties); None where ``a`` is constant (no ranking to
    keep), 0 where only ``b`` is (its ranking kept nothing of ``a``'s)."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if a.size < 2 or np.ptp(a) == 0:
        return None
    if np.ptp(b) == 0:
        return 0.0
    return float(sps.spearmanr(a, b).statistic)


def attribution_seed(seed: int, expl: Explanation) -> int:
    """The torch seed every re-attribution of one explanation runs under (trained and randomised alike)."""
    return stable_seed(seed, example_key(expl), expl.method, "sanity", bits=31)


def reattribute(lm: LoadedModel, expl: Explanation, seed: int) -> torch.Tensor:
    """The raw scores ``(steps, span)`` of ``expl``'s method (its name and parameters) on ``lm`` now."""
    method = methods.get(expl.method, **expl.params)
    torch.manual_seed(seed)
    raw, _ = method.attribute_with_info(lm, target_from_explanation(expl))
    return raw.detach().double().cpu()


def randomized_draw(p: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """``mean(p) + std(p) * z``, ``z ~ N(0, 1)`` from ``generator``, in ``p``'s dtype and device."""
    x = p.detach().double()
    std = x.std() if p.numel() > 1 else x.new_zeros(())
    z = torch.randn(p.shape, generator=generator, dtype=torch.float64)
    return (x.mean().cpu() + std.cpu() * z).to(p.device, p.dtype)


@contextmanager
def randomized(lm: LoadedModel, blocks: Sequence[int], seed: int = 0) -> Iterator[None]:
    """Inside: the parameters of the transformer ``blocks`` replaced by :func:`randomized_draw` (a generator per
    (seed, block)); on exit every one restored exactly from its CPU copy. Kept results are forgotten both ways."""
    stack = decoder_blocks(lm.model)
    saved: list[tuple[torch.nn.Parameter, torch.Tensor]] = []
    lm.forget()
    try:
        with torch.no_grad():
            for block in blocks:
                generator = torch.Generator().manual_seed(stable_seed(seed, "block", block))
                for p in stack[block].parameters():
                    saved.append((p, p.detach().to("cpu", copy=True)))
                    p.copy_(randomized_draw(p, generator))
        yield
    finally:
        with torch.no_grad():
            for p, original in reversed(saved):
                p.copy_(original.to(p.device))
        lm.forget()


def checked_blocks(n_blocks: int, stride: int) -> list[int]:
    """The blocks the checks randomise, top first: every ``stride``-th from the top, and block 0."""
    return sorted({*range(n_blocks - 1, -1, -stride), 0}, reverse=True)


def step_rows(name: str, trained: torch.Tensor, other: torch.Tensor, steps: list[int], x: int | None) -> list[Row]:
    """One ``Row(name, rho, x, step)`` per evaluated step where the trained scores rank anything."""
    rows = []
    for step in steps:
        rho = spearman(trained[step], other[step])
        if rho is not None:
            rows.append(Row(name, rho, x=x, step=step))
    return rows


def model_randomization(lm: LoadedModel, expl: Explanation, seed: int = 0, stride: int = 1,
                        step_stride: int = STEP_STRIDE.default) -> list[Row]:
    """Spearman's rho between the method's scores on the trained model and with blocks randomised, cascading
    from the top (``cascade_spearman``, ``x`` = lowest randomised block) and one block at a time
    (``independent_spearman``, ``x`` = the block); the weights are the trained ones again on return."""
    check_tokenizer(expl, lm)
    steps = evaluated_steps(expl, step_stride)
    torch_seed = attribution_seed(seed, expl)
    trained = reattribute(lm, expl, torch_seed)
    blocks = checked_blocks(len(decoder_blocks(lm.model)), stride)
    rows = []
    for k, block in enumerate(blocks):
        with randomized(lm, blocks[: k + 1], seed):
            rows += step_rows("cascade_spearman", trained, reattribute(lm, expl, torch_seed), steps, block)
        with randomized(lm, [block], seed):
            rows += step_rows("independent_spearman", trained, reattribute(lm, expl, torch_seed), steps, block)
    return rows


@lru_cache(maxsize=2)
def other_model(path: str, device: str, dtype: str) -> LoadedModel:
    """The permuted-label model, loaded once per (path, device, dtype) for every explanation of a run."""
    return load_model(path, device=device, dtype=dtype)


def data_randomization(lm: LoadedModel, permuted: LoadedModel, expl: Explanation, seed: int = 0,
                       step_stride: int = STEP_STRIDE.default) -> list[Row]:
    """Spearman's rho between the method's scores on ``lm`` (trained on true labels) and on ``permuted`` (the
    same fine-tuning on permuted labels): ``data_spearman``."""
    check_tokenizer(expl, lm)
    check_tokenizer(expl, permuted)
    torch_seed = attribution_seed(seed, expl)
    return step_rows("data_spearman", reattribute(lm, expl, torch_seed), reattribute(permuted, expl, torch_seed),
                     evaluated_steps(expl, step_stride), None)


def _model_rows(ctx: MetricContext, routing: str) -> list[Row]:
    return model_randomization(ctx.lm, ctx.explanation, ctx.options.seed, ctx.options.get(SANITY_STRIDE.name),
                               ctx.options.get(STEP_STRIDE.name))


def _data_rows(ctx: MetricContext, routing: str) -> list[Row]:
    path = ctx.options.get(PERMUTED_MODEL.name)  # given: Metric.needs
    dtype = str(next(ctx.lm.model.parameters()).dtype).removeprefix("torch.")
    permuted = other_model(str(path), str(ctx.lm.device), dtype)
    return data_randomization(ctx.lm, permuted, ctx.explanation, ctx.options.seed, ctx.options.get(STEP_STRIDE.name))


RHO_CAPTION = (f"Spearman's rho between the method's scores on the trained model and on the randomised one (mean "
               f"over examples, 95% interval). Near 1: the scores did not change, the method fails the check where "
               f"the whole interval lies above {FAIL_RHO} with every block randomised (docs/trust.md).")
register(Metric(
    "model-randomization", _model_rows, options=("seed",), declares=(SANITY_STRIDE, STEP_STRIDE),
    summary="sanity check: rank correlation of scores on trained vs randomised blocks (Adebayo et al. 2018)",
    tables=(TableSpec("table_model_randomization", "Sanity check: model-parameter randomisation",
                      RHO_CAPTION + " Cascading: layer x = blocks x..top randomised; independent: block x alone.",
                      "layers_by_methods",
                      (MetricRow("cascade_spearman", "Cascading randomisation ρ", False),
                       MetricRow("independent_spearman", "Independent randomisation ρ", False)), order=80),)))
register(Metric(
    "data-randomization", _data_rows, options=("seed",), declares=(PERMUTED_MODEL, STEP_STRIDE),
    needs=((PERMUTED_MODEL.name, "compares with a model fine-tuned on permuted labels: give --permuted-model FOLDER "
                                 "(llmattr finetune --permute-labels)"),),
    summary="sanity check: rank correlation of scores on the true-label vs a permuted-label fine-tune",
    tables=(TableSpec("table_data_randomization", "Sanity check: data randomisation", RHO_CAPTION,
                      "methods_by_datasets", (MetricRow("data_spearman", "Data randomisation ρ", False),),
                      order=81),)))
