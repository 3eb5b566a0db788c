"""The internals probe: one attention function for every architecture (see docs/architecture.md).

``install_probe(model)`` registers :func:`probe_attention` with ``transformers.AttentionInterface``
(and the sdpa mask builder with ``AttentionMaskInterface``) and switches the model to it. The attention
itself runs in PyTorch's memory-efficient ``scaled_dot_product_attention`` (through transformers' sdpa
function): no tensor grows with the square of the input length. Inside ``with Probe(...)`` it can

* record, per layer, q at the asked query rows, k and v, the attention probabilities of those rows only
  (recomputed from the recorded q and k: ``softmax(q_r k^T * scaling + mask_r)``), which keys the layer's
  mask let each row see, and the attention output before ``o_proj`` (Grad-ELLM, attention baselines,
  AIEG's NetAttention);
* replay the routing of a clean pass (fixed routing, paper 000 app. K): the clean pass's q and k give the
  probabilities, the current pass's values are mixed by them, ``softmax(q_c k_c^T * scaling + mask) v`` —
  again one sdpa call;
* scale value vectors per key position (Value Zeroing, Mohebbi et al. 2023).

Models with logit softcapping (Gemma-2), which sdpa cannot run, and code inside :func:`eager_attention`
take the full eager path: every row's ``(S, S)`` probabilities, the computation of transformers' eager
attention (the reference the tests compare the sdpa path with).

A :class:`Probe` and :class:`EagerAttention` are interceptions (:mod:`.intercept`): the attention function reads
the innermost probe and whether eager attention is in force off the one interception stack.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from ..lazy import lazy, no_grad, torch
from .intercept import Interception, innermost

sdpa = lazy("transformers.integrations.sdpa_attention")

PROBE_NAME = "llmattr_probe"
FIELDS = ("q", "k", "v", "probs", "out")


@dataclass
class LayerRecord:
    """One layer's attention internals for a forward pass, kept for the recorded query rows only.

    ``rows`` are absolute positions in the sequence (a cached prefix counts); fields not asked for are ``None``.
    """

    rows: torch.Tensor  # (R,) absolute positions of the recorded query rows
    mask: torch.Tensor | None  # the layer's attention mask as it got it (a reference; None: plain causal)
    shape: tuple[int, int, int]  # (B, Q, S): batch, query rows of the pass, keys
    scaling: float = 1.0  # the layer's score scaling (probabilities of other rows: ``attention_probs``)
    softcap: float | None = None
    q: torch.Tensor | None = None  # (B, H, R, D) queries after RoPE
    k: torch.Tensor | None = None  # (B, H_kv, S, D) keys after RoPE, as the layer holds them (GQA: H_kv heads)
    v: torch.Tensor | None = None  # (B, H_kv, S, D) values (after any value scaling)
    probs: torch.Tensor | None = None  # (B, H, R, S) attention probabilities
    out: torch.Tensor | None = None  # (B, Q, H, D) attention output of every query before o_proj (autograd graph)

    @property
    def visible(self) -> torch.Tensor:
        """``(B, R, S)`` bool: the keys the layer's mask let each recorded row attend to."""
        return self.visible_at(self.rows)

    def visible_at(self, rows: torch.Tensor) -> torch.Tensor:
        """``(B, len(rows), S)`` bool for any absolute query positions of the pass (a block of rows at a time,
        so recording every row never builds an ``(S, S)`` mask)."""
        batch, n_queries, n_keys = self.shape
        return visible_keys(self.mask, rows, n_queries, n_keys, batch)

    def keys(self) -> torch.Tensor:
        """``k`` repeated to the query heads: ``(B, H, S, D)``."""
        return repeat_heads(self.k, self.q.shape[1])

    def values(self) -> torch.Tensor:
        """``v`` repeated to the query heads: ``(B, H, S, D)``."""
        return repeat_heads(self.v, self.q.shape[1])


class Probe(Interception):
    """The interception that tells the attention function what to record or change.

    Args:
        record: ``True`` (every field) or the names of the fields to keep (``FIELDS``); ``False`` keeps none.
        rows: absolute query positions whose q and probabilities are recorded (``None``: every query row).
        layers: layers to record (``None``: all).
        replay: layer index -> :class:`LayerRecord` of a clean pass with ``q`` (at least the current query
            rows) and ``k``; that layer's attention uses the clean probabilities (fixed routing).
        value_scale: ``(B, S)`` factor applied to each key position's value vector (0 zeroes it).
        value_layers: layers where ``value_scale`` applies (``None``: all layers).
    """

    def __init__(
        self,
        record: bool | Iterable[str] = False,
        rows: torch.Tensor | None = None,
        layers: Iterable[int] | None = None,
        replay: dict[int, LayerRecord] | None = None,
        value_scale: torch.Tensor | None = None,
        value_layers: set[int] | None = None,
    ):
        self.fields = set(FIELDS if record is True else record or ())
        unknown = self.fields - set(FIELDS)
        if unknown:
            raise ValueError(f"unknown probe fields {sorted(unknown)}; valid: {FIELDS}")
        self.rows = rows
        self.record_layers = None if layers is None else set(layers)
        self.replay = replay
        self.value_scale = value_scale
        self.value_layers = value_layers
        self.layers: dict[int, LayerRecord] = {}

    def records(self, layer: int | None) -> bool:
        return bool(self.fields) and (self.record_layers is None or layer in self.record_layers)

    def stacked(self, name: str) -> torch.Tensor:
        """One recorded field for all layers, stacked on a new first axis (layer order)."""
        return torch.stack([getattr(self.layers[i], name) for i in sorted(self.layers)])


class EagerAttention(Interception):
    """Inside, every layer computes full eager attention (all ``(S, S)`` probabilities): the reference path."""


def eager_attention() -> EagerAttention:
    """``with eager_attention():`` every layer on the eager path (:class:`EagerAttention`)."""
    return EagerAttention()


def repeat_heads(x: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Key/value heads repeated to ``n_heads`` query heads (GQA): ``(B, H_kv, S, D) -> (B, H, S, D)``."""
    groups = n_heads // x.shape[1]
    return x if groups == 1 else x.repeat_interleave(groups, dim=1)


def visible_keys(attention_mask: torch.Tensor | None, rows: torch.Tensor, n_queries: int, n_keys: int,
                 batch: int) -> torch.Tensor:
    """Which keys the layer attends to from each absolute query position in ``rows``: ``(B, R, S)`` bool.

    ``attention_mask`` is the mask the layer got: ``None`` (plain causal: key j visible from position p
    iff j <= p), boolean ``(B, 1, Q, S)`` (sdpa: True = attend; sliding windows and padding included) or
    additive float (eager: 0 = attend).
    """
    if attention_mask is None:
        keys = torch.arange(n_keys, device=rows.device)
        return (keys[None, :] <= rows[:, None])[None].expand(batch, -1, -1)
    index = (rows - (n_keys - n_queries)).to(attention_mask.device)
    mask = attention_mask[:, 0, index, :n_keys]
    mask = mask if mask.dtype == torch.bool else mask > torch.finfo(mask.dtype).min
    return mask.expand(batch, -1, -1)


def attention_probs(query: torch.Tensor, key: torch.Tensor, visible: torch.Tensor, scaling: float,
                    softcap: float | None = None) -> torch.Tensor:
    """Eager attention probabilities ``softmax(q k^T * scaling (softcapped) + mask)``: ``(B, H, R, S)``.

    ``query`` ``(B, H, R, D)``, ``key`` ``(B, H, S, D)``, ``visible`` ``(B, R, S)``; hidden keys get the
    dtype's minimum, as in transformers' eager mask. Softmax in float32.
    """
    scores = torch.matmul(query, key.transpose(2, 3)) * scaling
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    scores = torch.where(visible[:, None].to(scores.device), scores, torch.finfo(scores.dtype).min)
    return torch.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)


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
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Attention with llmattr's hooks (AttentionInterface signature): sdpa unless eager is needed.

    Returns the output ``(B, Q, H, D)`` (transformers' layout) and, on the eager path only, the probabilities
    ``(B, H, Q, S)`` (``output_attentions``).
    """
    probe = innermost(Probe)
    layer = getattr(module, "layer_idx", None)
    batch, n_heads, n_queries = query.shape[:3]
    n_keys = key.shape[2]
    if scaling is None:
        scaling = query.shape[-1] ** -0.5
    if probe is not None and probe.value_scale is not None:
        if probe.value_layers is None or layer in probe.value_layers:
            value = value * probe.value_scale[:, None, -n_keys:, None].to(value.device, value.dtype)
    query_rows = torch.arange(n_keys - n_queries, n_keys, device=query.device)  # absolute positions
    replay = probe.replay.get(layer) if probe is not None and probe.replay else None
    if replay is not None:  # fixed routing: the clean pass's q and k set the probabilities
        query = replay.q[:, :, torch.searchsorted(replay.rows.to(query.device), query_rows)].expand(batch, -1, -1, -1)
        key = replay.k[:, :, :n_keys].expand(batch, -1, -1, -1)
    if softcap is not None or innermost(EagerAttention) is not None:
        visible = visible_keys(attention_mask, query_rows, n_queries, n_keys, batch)
        weights = attention_probs(query, repeat_heads(key, n_heads), visible, scaling, softcap)
        out = torch.matmul(weights, repeat_heads(value, n_heads)).transpose(1, 2).contiguous()
    else:
        out, weights = sdpa.sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                              scaling=scaling, **kwargs)
    if probe is not None and probe.records(layer):
        probe.layers[layer] = _record(probe, query, key, value, attention_mask, out, scaling, softcap)
    return out, weights


@no_grad
def _record(probe: Probe, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
            attention_mask: torch.Tensor | None, out: torch.Tensor, scaling: float,
            softcap: float | None) -> LayerRecord:
    """The probe's asked fields at its rows; probabilities recomputed from q and k for those rows only."""
    batch, n_heads, n_queries = query.shape[:3]
    n_keys = key.shape[2]
    rows = probe.rows
    if rows is None:
        rows = torch.arange(n_keys - n_queries, n_keys, device=query.device)
    rows = rows.to(query.device)
    q = query[:, :, rows - (n_keys - n_queries)]
    fields = probe.fields
    record = LayerRecord(rows=rows, mask=attention_mask, shape=(batch, n_queries, n_keys), scaling=scaling,
                         softcap=softcap,
                         q=q if "q" in fields else None, k=key if "k" in fields else None,
                         v=value if "v" in fields else None, out=out if "out" in fields else None)
    if "probs" in fields:
        record.probs = attention_probs(q, repeat_heads(key, n_heads), record.visible, scaling, softcap)
    return record


def install_probe(model: torch.nn.Module) -> None:
    """Register the probe attention function and switch ``model`` (and its sub-configs) to it."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(PROBE_NAME, probe_attention)
    AttentionMaskInterface.register(PROBE_NAME, sdpa_mask)
    model.set_attn_implementation(PROBE_NAME)
