"""The random baseline (paper 000's "Random", paper 003's random ranking): uniform scores, seeded."""

from __future__ import annotations

import zlib

from ..lazy import torch
from ..models.loading import LoadedModel
from ..targets import Target
from .base import AttributionMethod, register, source_features, spread


@register
class RandomBaseline(AttributionMethod):
    """Independent U(0, 1) scores per step and content token; where the prompt has sources, per step and source
    (each spread evenly over its tokens: :func:`~llmattr.methods.base.spread`).

    The generator is seeded with ``seed`` mixed with a CRC of the input ids: the same seed and input
    give the same scores, different inputs get different draws.
    """

    name = "random"
    family = "control"
    summary = "uniform random scores in [0, 1), seeded per input (the floor every method must beat)"
    needs_gradients = False
    signed = False
    cost = "no forward"
    defaults = {"seed": 0}
    control = True  # the report's control: every method is tested against it, never ranked

    def attribute(self, lm: LoadedModel, target: Target) -> torch.Tensor:
        ids = target.input_ids[0].to(torch.int64).numpy().tobytes()
        generator = torch.Generator().manual_seed(int(self.params["seed"]) * 1_000_003 + zlib.crc32(ids))
        a, b = target.span
        owner = source_features(target)
        if owner is None:
            return torch.rand((target.n_steps, b - a), generator=generator)
        return spread(torch.rand((target.n_steps, int(owner.max()) + 1), generator=generator), owner)

    @classmethod
    def head_scores(cls, model: torch.nn.Module, input_ids: torch.Tensor, seed: int = 0) -> torch.Tensor:
        """A sequence head's random ranking (paper 003): ``U(0, 1)`` per token, seeded by ``seed`` alone."""
        return torch.rand(input_ids.shape[1], generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
