"""Forward passes that compute logits only where they are needed."""

from __future__ import annotations

import torch

from .loading import LoadedModel


def logits_at(lm: LoadedModel, inputs_embeds: torch.Tensor, positions: torch.Tensor, **kwargs) -> torch.Tensor:
    """Logits ``(B, len(positions), V)`` at ``positions`` only (the LM head skips every other row)."""
    out = lm.model(inputs_embeds=inputs_embeds, logits_to_keep=positions.to(inputs_embeds.device),
                   use_cache=False, **kwargs)
    return out.logits


def target_logits(lm: LoadedModel, inputs_embeds: torch.Tensor, positions: torch.Tensor,
                  target_ids: torch.Tensor, **kwargs) -> torch.Tensor:
    """Logit of ``target_ids[t]`` at ``positions[t]``, for every batch row: ``(B, T)``."""
    logits = logits_at(lm, inputs_embeds, positions, **kwargs)
    index = target_ids.to(logits.device)[None, :, None].expand(logits.shape[0], -1, 1)
    return logits.gather(-1, index)[..., 0]
