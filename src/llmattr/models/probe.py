"""The internals probe: one attention function for every architecture (see docs/architecture.md).

``install_probe(model)`` registers :func:`probe_attention` with ``transformers.AttentionInterface``
(and the eager mask builder with ``AttentionMaskInterface``) and switches the model to it. Without an
active :class:`Probe` it computes plain eager attention. Inside ``with Probe(...)`` it can

* record, per layer, q and k (after RoPE), v (after GQA head sharing), the attention probabilities and
  the per-head output before ``o_proj`` (Grad-ELLM, attention baselines, AIEG's NetAttention);
* replay attention probabilities cached from a clean pass (the fixed-routing protocol, paper 000 app. K);
* scale value vectors per key position (Value Zeroing, Mohebbi et al. 2023).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

PROBE_NAME = "llmattr_probe"
_ACTIVE: list[Probe] = []


@dataclass
class LayerRecord:
    """One layer's attention internals for a forward pass. Shapes: (batch, heads, rows, ...)."""

    q: torch.Tensor  # (B, H, T, D) queries after RoPE
    k: torch.Tensor  # (B, H, S, D) keys after RoPE, repeated to the query heads
    v: torch.Tensor  # (B, H, S, D) values, repeated to the query heads
    probs: torch.Tensor  # (B, H, T, S) attention probabilities
    out: torch.Tensor  # (B, H, T, D) per-head output before o_proj (part of the autograd graph)


class Probe:
    """Context manager that tells the attention function what to record or change.

    Args:
        record: keep a :class:`LayerRecord` per layer in ``self.layers``.
        replay_probs: layer index -> clean attention probabilities ``(1 or B, H, S, S)``; the rows for
            the current queries replace the computed probabilities (fixed routing).
        value_scale: ``(B, S)`` factor applied to each key position's value vector (0 zeroes it).
        value_layers: layers where ``value_scale`` applies (``None``: all layers).
    """

    def __init__(
        self,
        record: bool = False,
        replay_probs: dict[int, torch.Tensor] | None = None,
        value_scale: torch.Tensor | None = None,
        value_layers: set[int] | None = None,
    ):
        self.record = record
        self.replay_probs = replay_probs
        self.value_scale = value_scale
        self.value_layers = value_layers
        self.layers: dict[int, LayerRecord] = {}

    def __enter__(self) -> Probe:
        _ACTIVE.append(self)
        return self

    def __exit__(self, *exc) -> None:
        _ACTIVE.remove(self)

    def stacked(self, name: str) -> torch.Tensor:
        """One recorded field for all layers, stacked on a new first axis (layer order)."""
        return torch.stack([getattr(self.layers[i], name) for i in sorted(self.layers)])


def _repeat_heads(x: torch.Tensor, n_heads: int) -> torch.Tensor:
    groups = n_heads // x.shape[1]
    return x if groups == 1 else x.repeat_interleave(groups, dim=1)


def probe_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    softcap: float | None = None,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Eager scaled dot-product attention with llmattr's hooks (AttentionInterface signature)."""
    probe = _ACTIVE[-1] if _ACTIVE else None
    layer = getattr(module, "layer_idx", None)
    n_heads = query.shape[1]
    key = _repeat_heads(key, n_heads)
    value = _repeat_heads(value, n_heads)
    if probe is not None and probe.value_scale is not None:
        if probe.value_layers is None or layer in probe.value_layers:
            value = value * probe.value_scale[:, None, -value.shape[2]:, None].to(value.dtype)
    if scaling is None:
        scaling = query.shape[-1] ** -0.5
    scores = torch.matmul(query, key.transpose(2, 3)) * scaling
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    if attention_mask is not None:
        scores = scores + attention_mask[..., : key.shape[2]]
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
    if probe is not None and probe.replay_probs is not None and layer in probe.replay_probs:
        clean = probe.replay_probs[layer]
        s_len, t_len = key.shape[2], query.shape[2]
        probs = clean[..., s_len - t_len : s_len, :s_len].to(probs.dtype).expand_as(probs)
    out = torch.matmul(probs, value)
    if probe is not None and probe.record:
        probe.layers[layer] = LayerRecord(q=query, k=key, v=value, probs=probs, out=out)
    return out.transpose(1, 2).contiguous(), probs


def install_probe(model: torch.nn.Module) -> None:
    """Register the probe attention function and switch ``model`` (and its sub-configs) to it."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, eager_mask

    AttentionInterface.register(PROBE_NAME, probe_attention)
    AttentionMaskInterface.register(PROBE_NAME, eager_mask)
    model.set_attn_implementation(PROBE_NAME)
