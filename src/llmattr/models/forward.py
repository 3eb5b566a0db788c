"""Forward passes that compute logits only where they are needed."""

from __future__ import annotations

import torch

from .loading import LoadedModel


def logits_at(lm: LoadedModel, inputs_embeds: torch.Tensor, positions: torch.Tensor, **kwargs) -> torch.Tensor:
    """Logits ``(B, len(positions), V)`` at ``positions`` only (the LM head skips every other row).

    With ``past_key_values`` (a cached prefix), ``inputs_embeds`` and ``positions`` refer to the tokens after it.
    """
    kwargs.setdefault("use_cache", False)
    out = lm.model(inputs_embeds=inputs_embeds, logits_to_keep=positions.to(inputs_embeds.device), **kwargs)
    return out.logits


def prefix_cache(lm: LoadedModel, prefix_embeds: torch.Tensor):
    """Key/value cache of ``prefix_embeds`` ``(B, P, D)``, computed without gradients (one row per batch row)."""
    from transformers import DynamicCache

    cache = DynamicCache(config=lm.model.config)
    with torch.no_grad():
        lm.model(inputs_embeds=prefix_embeds.detach(), past_key_values=cache, use_cache=True, logits_to_keep=1)
    return cache


def target_logits(lm: LoadedModel, inputs_embeds: torch.Tensor, positions: torch.Tensor,
                  target_ids: torch.Tensor, **kwargs) -> torch.Tensor:
    """Logit of ``target_ids[t]`` at ``positions[t]``, for every batch row: ``(B, T)``."""
    logits = logits_at(lm, inputs_embeds, positions, **kwargs)
    index = target_ids.to(logits.device)[None, :, None].expand(logits.shape[0], -1, 1)
    return logits.gather(-1, index)[..., 0]
