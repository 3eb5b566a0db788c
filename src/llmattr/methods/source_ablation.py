"""The model's objective with whole sources removed from the prompt: the forward passes every source-level
estimator (leave-one-out, ContextCite, AttriBoT's hierarchy) and source-level metric (top-k removal,
comprehensiveness, sufficiency, the LDS) runs.

Removing a source deletes its tokens: the remaining tokens close up and take contiguous positions, as if the
source's text had never been in the prompt (ContextCite and AttriBoT rebuild the context without it). A row
``keep[r]`` ``(n_sources,)`` keeps source ``i`` where it is true; its value is the objective ``F_t`` of every
explained step ``t`` (the target tokens sit at the end of the input, so they keep their order).

**The prefix cache** (AttriBoT's key/value caching). A causal model's keys and values of the tokens before a
row's first removed token are those of the unchanged prompt. One clean forward keeps every token's keys and
values; the rows, sorted by their first removed position ``f_r``, go in batches, and a batch reuses the clean
keys and values of its first ``P = min_r f_r`` tokens, so only what follows ``P`` runs. Rows of a batch differ in
length (each drops other tokens): they are left-padded after the prefix (attention mask 0 on the pads, position
ids counting only real tokens), so the explained positions are the batch's last ``T`` columns. A model with
sliding-window attention counts its window in cache slots, which pads would shift: there a batch holds only rows
of one length (no pads).

**Naive** (``reuse_prefix=False``, ``batch_size=1``): every row one full forward of its own input, nothing
shared: the reference the benchmark and the tests compare the cache with.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .. import objectives
from ..errors import LlmattrError
from ..lazy import cache_utils, no_grad, torch
from ..models.forward import PrefixLayer, content_key
from ..models.loading import LoadedModel
from ..models.memory import forward_batch
from ..sources.spans import Sources
from ..targets import Target

AUTO = "auto"  # the estimators' default batch size: :func:`rows_per_pass`


def prompt_sources(target: Target, what: str) -> Sources:
    """The prompt's sources, or one line saying ``what`` needs them."""
    sources = target.prompt.sources
    if sources is None or not len(sources):
        raise LlmattrError(f"{what} scores sources: the prompt has none (give documents=[...], --document or "
                           "--context)")
    return sources


def sliding_window(lm: LoadedModel) -> bool:
    """Whether any layer attends through a sliding window (Gemma-3's local layers, Mistral's window)."""
    config = lm.config
    if getattr(config, "sliding_window", None) is None:
        return False
    types = getattr(config, "layer_types", None)
    return types is None or "sliding_attention" in types


@dataclass(frozen=True)
class Ablation:
    """What a batch of ablated rows is scored against: the target's input ids ``(L,)``, its sources' token
    positions, the objective and its foil."""

    ids: torch.Tensor
    groups: tuple[tuple[int, ...], ...]
    target_ids: torch.Tensor
    explained: objectives.Objective
    foil: torch.Tensor | None

    @classmethod
    def of(cls, target: Target, groups: tuple[tuple[int, ...], ...], explained: objectives.Objective,
           foil: torch.Tensor | None = None) -> Ablation:
        return cls(target.input_ids[0].cpu(), groups, target.target_ids, explained, foil)

    def key(self, *rule) -> tuple:
        """The key of this ablation's objectives on the model's kept store, with the ``rule`` they were run by."""
        foil = () if self.foil is None else (self.foil,)
        return ("ablated-objective", self.groups, self.explained.name, *rule,
                content_key(self.ids, self.target_ids, *foil))

    @property
    def steps(self) -> int:
        return int(self.target_ids.shape[0])

    def kept_tokens(self, keep: torch.Tensor) -> torch.Tensor:
        """``(R, L)`` bool: which input tokens each row keeps (every token outside the removed sources)."""
        tokens = torch.ones(keep.shape[0], len(self.ids), dtype=torch.bool)
        for i, group in enumerate(self.groups):
            removed = ~keep[:, i]
            if removed.any():
                tokens[removed.nonzero()[:, 0, None], torch.tensor(group)[None]] = False
        return tokens

    def first_removed(self, tokens: torch.Tensor) -> torch.Tensor:
        """``(R,)`` each row's first removed position (``L`` where nothing is removed)."""
        width = tokens.shape[1]
        index = torch.arange(width).expand_as(tokens)
        return torch.where(tokens, width, index).min(dim=1).values


@no_grad
def clean_pass(lm: LoadedModel, ablation: Ablation) -> tuple[torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]]]:
    """One forward of the unablated input: ``F_t`` ``(T,)`` and every layer's keys and values."""
    cache = cache_utils.DynamicCache()
    steps = ablation.steps
    ids = ablation.ids.to(lm.device)[None]
    keep = torch.arange(len(ablation.ids) - steps, len(ablation.ids), device=lm.device)
    logits = lm.model(input_ids=ids, cache=cache, use_cache=True, logits_to_keep=keep).logits
    value = ablation.explained(logits.float(), ablation.target_ids, ablation.foil)[0]
    return value.cpu(), [(layer.keys, layer.values) for layer in cache.layers]


@no_grad
def batch_objective(lm: LoadedModel, ablation: Ablation, rows: list[torch.Tensor], start: int,
                    layers: list[tuple[torch.Tensor, torch.Tensor]] | None) -> torch.Tensor:
    """``F_t`` ``(B, T)`` of ``rows`` (each the kept token ids after position ``start``), after the clean keys and
    values of the first ``start`` tokens (``layers``; none when ``start`` is 0), left-padded after the prefix."""
    width = max(len(r) for r in rows)
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    mask = torch.zeros(len(rows), start + width, dtype=torch.long)
    mask[:, :start] = 1
    positions = torch.full((len(rows), width), start, dtype=torch.long)
    for k, row in enumerate(rows):
        ids[k, width - len(row):] = row
        mask[k, start + width - len(row):] = 1
        positions[k, width - len(row):] = torch.arange(start, start + len(row))
    kwargs = {}
    if start:
        kwargs = {"cache": cache_utils.Cache(layers=[PrefixLayer(k[:, :, :start], v[:, :, :start]) for k, v in layers]),
                  "use_cache": True}
    steps = ablation.steps
    keep = torch.arange(width - steps, width, device=lm.device)
    logits = lm.model(input_ids=ids.to(lm.device), attention_mask=mask.to(lm.device),
                      position_ids=positions.to(lm.device), logits_to_keep=keep, **kwargs).logits
    return ablation.explained(logits.float(), ablation.target_ids, ablation.foil).cpu()


def batches(order: list[int], lengths: list[int], batch_size: int, same_length: bool) -> list[list[int]]:
    """``order`` cut into batches of at most ``batch_size`` rows (of one length each when ``same_length``), each
    keeping the rows' order."""
    groups: dict[int, list[int]] = {}
    for r in order:
        groups.setdefault(lengths[r] if same_length else 0, []).append(r)
    return [g[i:i + batch_size] for g in groups.values() for i in range(0, len(g), batch_size)]


def rows_per_pass(lm: LoadedModel, batch_size: int | str, tokens: int) -> int:
    """Ablated rows per forward pass: ``batch_size``, or for ``"auto"`` one row on a CPU and, on an accelerator,
    the rows of ``tokens`` tokens that :func:`~llmattr.models.memory.forward_batch` allows. One row on a CPU: a row
    of a long context already fills the cores, and a batch reuses only the prefix before its earliest removed
    token, so batching rows costs the cache its savings (``benchmarks/bench_sources.py``: LOO with the cache 1.56x
    naive at 1 row per pass, 0.67x at 16, 20 documents, docs/sources.md)."""
    if batch_size != AUTO:
        return int(batch_size)
    return 1 if lm.device.type == "cpu" else forward_batch(lm, tokens)


@no_grad
def ablated_objective(lm: LoadedModel, ablation: Ablation, keep: torch.Tensor, batch_size: int | str = AUTO,
                      reuse_prefix: bool = True, clean: tuple | None = None) -> torch.Tensor:
    """``F_t`` ``(R, T)`` of each row of ``keep`` ``(R, n_sources)`` (module docstring), ``batch_size`` rows per
    pass (:func:`rows_per_pass`).

    ``reuse_prefix``: reuse the clean keys and values before each batch's first removed token (``clean``: a
    :func:`clean_pass` already run); otherwise every row runs from the first token. Each row's result is kept on
    the model (:meth:`~llmattr.models.kept.Kept.rows`) and read back by a later call with the same ablation, prefix
    rule and batch size: the estimators and metrics of several methods ablate the same few sources."""
    batch_size = rows_per_pass(lm, batch_size, len(ablation.ids))

    def compute(keep: torch.Tensor) -> torch.Tensor:
        tokens = ablation.kept_tokens(keep)
        length, steps = len(ablation.ids), ablation.steps
        if reuse_prefix:
            first = ablation.first_removed(tokens).clamp_max(length - steps).tolist()
            layers = (clean or clean_pass(lm, ablation))[1]
        else:
            first, layers = [0] * len(keep), None
        order = sorted(range(len(keep)), key=lambda r: first[r])
        lengths = tokens.sum(1).tolist()
        out = torch.empty(len(keep), steps)
        for batch in batches(order, lengths, batch_size, sliding_window(lm)):
            start = first[batch[0]]
            rows = [ablation.ids[start:][tokens[r, start:]] for r in batch]
            out[batch] = batch_objective(lm, ablation, rows, start, layers)
        return out

    return lm.kept.rows(lm.model, ablation.key(reuse_prefix, batch_size), keep.bool().cpu(), compute)


def contextcite_masks(n_sources: int, num_ablations: int, keep_prob: float, base_seed: int = 0) -> torch.Tensor:
    """``(num_ablations, n_sources)`` keep masks drawn as the package draws them: row ``s`` from
    ``numpy.random.RandomState(base_seed + s).choice([False, True], p=[1 - keep_prob, keep_prob])``."""
    rows = [np.random.RandomState(base_seed + s).choice([False, True], size=n_sources, p=[1 - keep_prob, keep_prob])
            for s in range(num_ablations)]
    return torch.from_numpy(np.stack(rows))


def logit_response(log_probs: torch.Tensor) -> torch.Tensor:
    """ContextCite's response of each row: ``logit P(y) = log P - log(1 - P)`` with ``log P = sum_t log p(y_t)``
    (``log_probs`` ``(R, T)``; the package's ``aggregate_logit_probs(..., "logit_prob")``)."""
    total = log_probs.double().sum(1)
    return total - torch.log(-torch.expm1(total))
