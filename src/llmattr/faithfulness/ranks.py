"""Ranks of attribution scores: the top K% tokens that ranking metrics remove or keep (paper 003 sec. 4.2's K)."""

from __future__ import annotations

from ..lazy import torch

K_GRID = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)  # paper 003's perturbation ratios


def counts(fractions, m: int) -> list[int]:
    """Tokens in the top ``fraction`` of ``m``: round half up, so 5% of 10 tokens is 1."""
    return [int(f * m + 0.5 + 1e-9) for f in fractions]


def top_masks(scores: torch.Tensor, ks: list[int]) -> torch.Tensor:
    """``(len(ks), m)`` bool: row j marks the ``ks[j]`` highest-scored tokens (ties: earlier token first)."""
    order = torch.sort(-scores.double(), stable=True).indices
    rank = torch.empty_like(order)
    rank[order] = torch.arange(scores.numel())
    return rank[None, :] < torch.tensor(ks)[:, None]
