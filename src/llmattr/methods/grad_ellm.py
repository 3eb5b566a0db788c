"""Grad-ELLM (paper 000, sec. 3.3, eqs. 9-11 and appendix B, eqs. 20-23).

The gradients are those of the target token's logit ``y^c`` (the paper's quantity) by default; the ``objective``
parameter picks another one of :mod:`llmattr.objectives` (``contrast`` with a ``foil``:
``y^c - y^foil``).
"""

from __future__ import annotations

from ..lazy import torch
from ..models.forward import logits_at
from ..models.loading import LoadedModel
from ..models.probe import LayerRecord, Probe
from ..scores import minmax
from ..targets import Target
from .backprop import step_gradients
from .base import AttributionMethod, choice, register


def token_weights(record: LayerRecord, attention: str, similarity: str) -> torch.Tensor:
    """lambda_i^h for each step (the record's rows): ``(T, H, S)``; keys the layer does not attend to get 0.

    ``loosened``: min-max over visible keys of q_t . k_i (paper 000 eq. 11's Phi); ``softmax``: the
    model's attention probabilities (the paper's "w/o"). ``cosine``: the cosine of q and k per head;
    ``cosine-full``: one cosine over the full concatenated width (all heads), as the Grad-ECLIP code.
    Visible means what the layer's own attention mask lets the query see: causal keys, within the window on
    sliding-window layers (Gemma-3), not padding.
    """
    mask = record.visible[0][:, None, :]  # (T, 1, S)
    if attention == "softmax":
        return record.probs[0].transpose(0, 1) * mask
    q = record.q[0]  # (H, T, D)
    k = record.keys()[0]  # (H, S, D)
    if similarity == "cosine":
        q, k = torch.nn.functional.normalize(q, dim=-1), torch.nn.functional.normalize(k, dim=-1)
    if similarity == "cosine-full":  # one cosine over the concatenated heads (the Grad-ECLIP code's width)
        q = q / q.norm(dim=(0, 2), keepdim=True).clamp_min(1e-12)
        k = k / k.norm(dim=(0, 2), keepdim=True).clamp_min(1e-12)
        sim = torch.einsum("htd,hsd->ts", q, k)[:, None, :].expand(-1, q.shape[0], -1)
    else:
        sim = torch.einsum("htd,hsd->ths", q, k)
    lo = torch.where(mask, sim, torch.inf).amin(-1, keepdim=True)
    hi = torch.where(mask, sim, -torch.inf).amax(-1, keepdim=True)
    lam = (sim - lo) / (hi - lo).clamp_min(torch.finfo(sim.dtype).tiny)
    return torch.where(mask, lam, torch.zeros_like(lam))


def layer_map(record: LayerRecord, w: torch.Tensor, attention: str, similarity: str) -> torch.Tensor:
    """sum_h lambda_i^h (w^h . v_i^h) for one layer, before the ReLU: ``(T, S)`` (eq. 11 per head)."""
    lam = token_weights(record, attention, similarity)
    wv = torch.einsum("thd,hsd->ths", w, record.values()[0])
    return (lam * wv).sum(1)


@register
class GradELLM(AttributionMethod):
    """Gradient-weighted attention values, summed over the last ``layers`` layers (paper 000)."""

    name = "grad-ellm"
    family = "gradient x attention"
    summary = "Grad-ELLM: ReLU(sum_h lambda_i (dl/do^h . v_i)) over the last K layers, min-max per step"
    needs_gradients = True
    memory_kind = "backward"
    signed = False
    cost = "1 forward + 1 backward (all steps share them)"
    layer_sweep = "layers"  # `evaluate --layers` sweeps the number of last layers aggregated (paper 000 Fig. 5)
    defaults = {"layers": "all", "attention": "loosened", "similarity": "dot", "relu": "per-layer"}
    objective = "logit"
    rules = {"attention": choice(("loosened", "softmax"), "grad-ellm attention must be 'loosened' or 'softmax'"),
             "similarity": choice(("dot", "cosine", "cosine-full"),
                                  "grad-ellm similarity must be 'dot', 'cosine' or 'cosine-full'"),
             "relu": choice(("per-layer", "after-sum"), "grad-ellm relu must be 'per-layer' or 'after-sum'"),
             "layers": ("last-layers", "all", "grad-ellm layers must be 'all' or a positive number of last layers")}

    def _layers(self, n_layers: int) -> list[int]:
        k = n_layers if self.params["layers"] == "all" else min(int(self.params["layers"]), n_layers)
        return list(range(n_layers - k, n_layers))

    def attribute(self, lm: LoadedModel, target: Target) -> torch.Tensor:
        embeds = lm.embed(target.input_ids).detach().requires_grad_(True)
        positions = target.positions.to(lm.device)
        layers = self._layers(lm.config.get_text_config().num_hidden_layers)
        fields = ("q", "k", "v", "out", "probs" if self.params["attention"] == "softmax" else "q")
        explained, foil = self.explained(lm)
        with torch.enable_grad(), Probe(record=fields, rows=positions, layers=layers) as probe:
            scores = explained(logits_at(lm, embeds, positions)[0], target.target_ids, foil)  # (T,)
        records = [probe.layers[k] for k in layers]
        grads = step_gradients(scores, [r.out for r in records])  # each (T, 1, S, H, D)
        steps = torch.arange(target.n_steps, device=lm.device)
        total = None
        for record, grad in zip(records, grads, strict=True):
            w = grad[:, 0][steps, positions]  # (T, H, D): w^h at step t's query position
            h = layer_map(record, w.detach(), self.params["attention"], self.params["similarity"])
            h = h.detach().float()
            if self.params["relu"] == "per-layer":
                h = h.clamp_min(0)
            total = h if total is None else total + h
        if self.params["relu"] == "after-sum":
            total = total.clamp_min(0)
        a, b = target.span
        return minmax(total[:, a:b])
