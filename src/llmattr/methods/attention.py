"""Raw attention (paper 000's "Attention" baseline; paper 004's "Attn.-Only" with ``layers="all"``)."""

from __future__ import annotations

from ..lazy import torch
from ..models.forward import logits_at
from ..models.loading import LoadedModel
from ..models.probe import Probe
from ..targets import Target
from .base import AttributionMethod, choice, register


def mean_attention(lm: LoadedModel, input_ids: torch.Tensor, positions: torch.Tensor,
                   layers: str = "last") -> torch.Tensor:
    """Attention probabilities from each query position to every key, averaged over heads: ``(T, S)``.

    ``layers="last"`` reads the last layer (Inseq's default for ``attention``); ``"all"`` also averages
    over every layer (paper 004's NetAttention / "Attn.-Only"). One forward pass, no backward; the probe
    keeps the probabilities of the explained rows only (``(H, T, S)`` per chosen layer).
    """
    positions = positions.to(lm.device)
    n_layers = lm.config.get_text_config().num_hidden_layers
    chosen = range(n_layers) if layers == "all" else [n_layers - 1]
    with torch.no_grad(), Probe(record=("probs",), rows=positions, layers=chosen) as probe:
        logits_at(lm, lm.embed(input_ids), positions[-1:])
    probs = probe.stacked("probs")[:, 0]  # (L, H, T, S)
    return probs.float().mean(dim=(0, 1))


@register
class Attention(AttributionMethod):
    """Attention weight from the explained step's query position to each content token."""

    name = "attention"
    family = "attention"
    summary = "attention probabilities from the predicting position, mean over heads (last layer or all)"
    needs_gradients = False
    signed = False
    cost = "1 forward (all steps share it)"
    defaults = {"layers": "last"}
    rules = {"layers": choice(("last", "all"), "attention layers must be 'last' or 'all'")}

    def attribute(self, lm: LoadedModel, target: Target) -> torch.Tensor:
        a, b = target.span
        return mean_attention(lm, target.input_ids, target.positions, self.params["layers"])[:, a:b]
