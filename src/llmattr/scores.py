"""Mapping a method's raw scores to retain probabilities in [0, 1] (docs/faithfulness.md).

The soft metrics of paper 000 read scores as the probability of keeping each content token. Unless a
method's paper says otherwise, raw scores of one step are mapped by :func:`retain_probs`.
"""

from __future__ import annotations

from .errors import LlmattrError
from .lazy import torch

UNIFORM = "retain probability 0.5 for every token (no token ranks above another)"


def check_finite(raw: torch.Tensor, what: str = "scores") -> None:
    """Refuse NaN or infinite scores with one clear error."""
    if not torch.isfinite(raw).all():
        raise LlmattrError(f"{what} contain NaN or infinite values; fix the attribution before evaluating it")


def minmax(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Min-max normalisation along ``dim``; a constant slice maps to zeros."""
    lo = x.amin(dim=dim, keepdim=True)
    span = x.amax(dim=dim, keepdim=True) - lo
    return torch.where(span > 0, (x - lo) / span.clamp_min(torch.finfo(x.dtype).tiny), torch.zeros_like(x))


def pos_norm(a: torch.Tensor) -> torch.Tensor:
    """The positive part over its sum along the last axis (paper 004 eq. 13's PosNorm; an alignment metric's
    normalisation): ``max(a, 0) / sum max(a, 0)``; a row with no positive entry stays all zero."""
    pos = a.clamp_min(0)
    total = pos.sum(-1, keepdim=True)
    return torch.where(total > 0, pos / total.clamp_min(torch.finfo(pos.dtype).tiny), torch.zeros_like(pos))


def retain_probs(raw: torch.Tensor, signed: bool) -> tuple[torch.Tensor, list[str]]:
    """Map raw scores ``(..., m)`` to retain probabilities in [0, 1] per step (last axis = tokens).

    Rule: signed scores keep their positive part; then min-max over the content span; a constant or
    all-zero vector becomes uniform 0.5 (a warning is returned). Exact 0s and 1s stay: pi-Soft's alpha search
    (:func:`llmattr.faithfulness.soft.transform`) reads them as the limits of ``s**alpha``, with no clip.
    """
    check_finite(raw)
    x = raw.clamp_min(0) if signed else raw
    constant = (x.amax(-1) - x.amin(-1)) <= 0
    out = torch.where(constant[..., None], torch.full_like(x, 0.5), minmax(x))
    return out, constant_warnings(raw, constant, signed)


def constant_warnings(raw: torch.Tensor, constant: torch.Tensor, signed: bool) -> list[str]:
    """One line per reason a step's scores could not be ranked (``constant``: per step), naming the steps: signed
    scores with no positive part (their positive part is all zero), all-zero scores, or one value repeated."""
    rows = raw.reshape(-1, raw.shape[-1])
    reasons: dict[str, list[int]] = {}
    for step in constant.reshape(-1).nonzero().flatten().tolist():
        row = rows[step]
        reason = ("all-zero scores" if bool((row == 0).all()) else
                  "signed scores with no positive part (the soft metrics keep the positive part)"
                  if signed and bool((row <= 0).all()) else "constant scores")
        reasons.setdefault(reason, []).append(step)
    return [f"{reason} at step{'s' * (len(steps) > 1)} {', '.join(map(str, steps))}: {UNIFORM}"
            for reason, steps in reasons.items()]
