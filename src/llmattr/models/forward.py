"""Forward passes that compute logits only where they are needed, and prefix key/value caches.

Perturbation methods and metrics change only the content span; everything before it (system prompt,
chat markers) is the same in every perturbed row. :class:`SharedPrefix` holds that prefix's keys and
values, computed once, and serves them to batches of any size through :class:`PrefixLayer`, a cache
layer that prepends the stored prefix without storing anything new (one prefix serves every batch and
is never mutated).
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING

from ..lazy import cache_utils, derived, forward_ad, no_grad, torch
from .loading import LoadedModel
from .probe import eager_attention

if TYPE_CHECKING:
    from transformers.cache_utils import Cache, DynamicCache


def logits_at(lm: LoadedModel, inputs_embeds: torch.Tensor, positions: torch.Tensor, **kwargs) -> torch.Tensor:
    """Logits ``(B, len(positions), V)`` at ``positions`` only (the LM head skips every other row).

    With ``cache`` (a cached prefix), ``inputs_embeds`` and ``positions`` refer to the tokens after it.
    ``positions`` is an index tensor, never the integer form of ``logits_to_keep``: an integer slices the hidden
    states into a strided ``(B, k, d)`` view, which the LM head's matmul cannot fold into one matrix product, so it
    broadcasts the ``(V, d)`` head over the batch (a ``B x V x d`` copy: 0.78 s and 0.9 GB for 16 rows of SmolLM2 in
    bfloat16, 4x the folded product in float32); an index gathers contiguous rows.
    """
    kwargs.setdefault("use_cache", False)
    out = lm.model(inputs_embeds=inputs_embeds, logits_to_keep=positions.to(inputs_embeds.device), **kwargs)
    return out.logits


def prefix_cache(lm: LoadedModel, prefix_embeds: torch.Tensor) -> Cache:
    """Key/value cache of ``prefix_embeds`` ``(B, P, D)``, computed without gradients (one row per batch row).

    The keys and values are kept on the model (``lm.kept``, :class:`~.kept.Kept`: its byte budget, bypassed while a
    probe or eager attention is in force, dropped when the weights change) for the next call with the same
    embeddings: every example of a task shares its template, so the gradient methods run it once per task, not once
    per example. Its layers are :class:`PrefixLayer`: a forward through it stores nothing, so rerunning a block
    (activation checkpointing) sees the same prefix."""
    layers = lm.kept.fetch(lm.model, ("prefix-cache", content_key(prefix_embeds)),
                           lambda: prefix_key_values(lm, prefix_embeds))
    return cache_utils.Cache(layers=[PrefixLayer(k, v) for k, v in layers])


@no_grad
def zero_input_logits(lm: LoadedModel, positions: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """Logits ``(1, T, V)`` at the increasing ``positions`` ``(T,)`` of an input whose every embedding is zero.

    That input is the path methods' zero baseline, the same in every example; a causal model's state at position
    ``p`` depends on the inputs up to ``p`` alone, so the keys and values of the zeros before ``positions[0]`` are a
    slice of one all-zero prefix kept on the model (``lm.kept``: the longest asked for; while a probe or eager
    attention is in force, the whole input runs) and only the rows from ``positions[0]`` on run.
    ``like``: an embedding tensor ``(1, S, D)`` whose dtype and device the zeros take.
    """
    start = int(positions[0])
    zeros = like.new_zeros(1, int(positions[-1]) + 1, like.shape[-1])
    if lm.kept.bypassed() or not start:
        return logits_at(lm, zeros, positions)
    key = ("zero-prefix", content_key(zeros[:, :0]))  # dtype, device and width; the length is the kept prefix's own
    layers = lm.kept.get(lm.model, key)
    if layers is None or layers[0][0].shape[-2] < start:
        layers = lm.kept.keep(lm.model, key, prefix_key_values(lm, zeros[:, :start]))
    cache = cache_utils.Cache(layers=[PrefixLayer(k[:, :, :start], v[:, :, :start]) for k, v in layers])
    return logits_at(lm, zeros[:, start:], positions - start, cache=cache, use_cache=True)


def content_key(*tensors: torch.Tensor) -> tuple:
    """A key for the exact contents of ``tensors``: each one's shape, dtype, device and a SHA-256 of its bytes."""
    return tuple((tuple(t.shape), str(t.dtype), str(t.device),
                  hashlib.sha256(t.detach().contiguous().view(torch.uint8).cpu().numpy().tobytes()).hexdigest())
                 for t in tensors)


def prefix_key_values(lm: LoadedModel, prefix_embeds: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Each layer's keys and values ``(B, kv_heads, P, head_dim)`` of ``prefix_embeds``: one no-gradient forward."""
    cache = cache_utils.DynamicCache()
    with torch.no_grad():
        lm.model(inputs_embeds=prefix_embeds.detach(), cache=cache, use_cache=True, logits_to_keep=1)
    return [(layer.keys, layer.values) for layer in cache.layers]


class PrefixLayerBody:
    """Cache layer with a fixed ``(1 or B, kv_heads, P, D)`` prefix: ``update`` prepends it and stores nothing."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor):
        super().__init__()
        self.keys, self.values = keys, values
        self.dtype, self.device = keys.dtype, keys.device
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        batch = key_states.shape[0]
        keys = torch.cat([self.keys.expand(batch, -1, -1, -1), key_states], dim=-2)
        values = torch.cat([self.values.expand(batch, -1, -1, -1), value_states], dim=-2)
        return keys, values


PrefixLayer = derived("PrefixLayer", PrefixLayerBody, lambda: cache_utils.DynamicLayer)


class SharedPrefix:
    """The keys and values of the first ``length`` tokens of one sequence, shared by batches of any size.

    Keep it from a clean forward of the whole sequence (:func:`logits_and_prefix`) or run the prefix alone
    (:meth:`compute`); :meth:`cache` gives a fresh cache object to pass
    as ``cache`` with the tokens after the prefix as input.
    """

    def __init__(self, layers: list[tuple[torch.Tensor, torch.Tensor]], length: int):
        self.layers, self.length = layers, length

    @classmethod
    def from_cache(cls, cache: DynamicCache, length: int) -> SharedPrefix:
        return cls([(layer.keys[:1, :, :length], layer.values[:1, :, :length]) for layer in cache.layers], length)

    @classmethod
    @no_grad
    def compute(cls, lm: LoadedModel, input_ids: torch.Tensor, length: int) -> SharedPrefix:
        """Run the first ``length`` tokens of ``input_ids`` ``(1, S)`` once (no prefix when ``length`` is 0)."""
        if not length:
            return cls([], 0)
        return logits_and_prefix(lm, lm.embed(input_ids[:1, :length]), torch.tensor([length - 1]), length)[1]

    def cache(self) -> Cache:
        return cache_utils.Cache(layers=[PrefixLayer(k, v) for k, v in self.layers])

    def logits_at(self, lm: LoadedModel, suffix_embeds: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """:func:`logits_at` for rows of ``prefix + suffix_embeds``; ``positions`` count from the sequence start."""
        if not self.length:
            return logits_at(lm, suffix_embeds, positions)
        return logits_at(lm, suffix_embeds, positions - self.length, cache=self.cache(), use_cache=True)


class PathPrefix:
    """The first ``P`` tokens' keys and values at each point ``x0 + alpha_k (x - x0)`` of a straight path, and
    their derivatives along it, ``dKV_k = J_KV(alpha_k) (x - x0)`` (the prefix's share of a path integral).

    A causal model's later tokens see the prefix only through these keys and values, so for any ``F`` of the
    later tokens the chain rule through the cache gives the prefix's summed attribution without its backward:

        sum_{i < P} (x - x0)_i . dF/dx_i (x0 + alpha_k (x - x0)) = <dF/dKV_k, dKV_k>.

    :meth:`cache` serves keys ``K_k + s_k dK_k`` (values alike) for a zero vector ``s`` that requires a
    gradient: one backward of the later tokens gives ``dF/ds_k = <dF/dKV_k, dKV_k>`` per path point and step,
    and no gradient of the cache is kept. The derivatives come from forward-mode AD
    (``torch.autograd.forward_ad``) through eager attention (PyTorch's sdpa kernels have no forward-mode
    derivative): ``(P, P)`` probabilities per layer and path point, ``P`` the prefix length. Where the prefix
    is the same at every point (``x = x0`` there) there is one row and no derivative.
    """

    def __init__(self, layers: list[tuple[torch.Tensor, torch.Tensor]],
                 tangents: list[tuple[torch.Tensor, torch.Tensor]] | None, length: int):
        self.layers, self.tangents, self.length = layers, tangents, length

    @classmethod
    @no_grad
    def compute(cls, lm: LoadedModel, x: torch.Tensor, x0: torch.Tensor, alphas: torch.Tensor,
                batch_size: int) -> PathPrefix:
        """The prefix ``x``, ``x0`` ``(1, P, D)`` at ``alphas`` ``(n,)``, ``batch_size`` points per forward."""
        length = x.shape[1]
        if torch.equal(x, x0):
            cache = cache_utils.DynamicCache()
            lm.model(inputs_embeds=x, cache=cache, use_cache=True, logits_to_keep=1)
            return cls([(layer.keys, layer.values) for layer in cache.layers], None, length)
        parts = []
        for start in range(0, len(alphas), batch_size):
            a = alphas[start:start + batch_size].to(x.device, x.dtype)[:, None, None]
            parts.append(_kv_derivatives(lm, x0 + a * (x - x0), (x - x0).expand(len(a), -1, -1)))
        layers = [tuple(torch.cat([p[0][k][j] for p in parts]) for j in range(2)) for k in range(len(parts[0][0]))]
        tangents = [tuple(torch.cat([p[1][k][j] for p in parts]) for j in range(2)) for k in range(len(parts[0][1]))]
        return cls(layers, tangents, length)

    def cache(self, rows: slice, scale: torch.Tensor | None = None) -> Cache:
        """A cache of the path points ``rows`` (every row for a constant prefix); with ``scale`` ``(n,)``, keys and
        values ``K + scale dK``."""
        if self.tangents is None or scale is None:
            pick = (lambda t: t) if self.tangents is None else (lambda t: t[rows])
            return cache_utils.Cache(layers=[PrefixLayer(pick(k), pick(v)) for k, v in self.layers])
        s = scale[:, None, None, None]
        return cache_utils.Cache(layers=[
            PrefixLayer(k[rows] + s * dk[rows].to(k.dtype), v[rows] + s * dv[rows].to(v.dtype))
            for (k, v), (dk, dv) in zip(self.layers, self.tangents, strict=True)])


def _kv_derivatives(lm: LoadedModel, points: torch.Tensor, direction: torch.Tensor):
    """Keys/values of ``points`` ``(n, P, D)`` and their forward-mode derivatives along ``direction``."""
    with forward_ad.dual_level(), eager_attention():
        cache = cache_utils.DynamicCache()
        lm.model(inputs_embeds=forward_ad.make_dual(points, direction), cache=cache, use_cache=True,
                 logits_to_keep=1)
        unpacked = [(forward_ad.unpack_dual(layer.keys), forward_ad.unpack_dual(layer.values))
                    for layer in cache.layers]
    return ([(k.primal, v.primal) for k, v in unpacked], [(k.tangent, v.tangent) for k, v in unpacked])


def logits_and_prefix(lm: LoadedModel, inputs_embeds: torch.Tensor, positions: torch.Tensor,
                      length: int) -> tuple[torch.Tensor, SharedPrefix]:
    """:func:`logits_at` of one sequence ``(1, S, D)``, keeping its first ``length`` tokens as a :class:`SharedPrefix`
    (a clean pass whose prefix the perturbed rows then reuse)."""
    cache = cache_utils.DynamicCache()
    logits = logits_at(lm, inputs_embeds, positions, cache=cache, use_cache=True)
    return logits, SharedPrefix.from_cache(cache, length)



@no_grad
def padded_last_probs(lm: LoadedModel, ids: torch.Tensor, mask: torch.Tensor, batch_size: int = 64,
                      prefix: SharedPrefix | None = None) -> torch.Tensor:
    """Next-token probabilities ``(N, V)`` after each row of a left-padded ``(N, S)`` batch (mask 0 = pad);
    position ids count only the unpadded tokens, logits are computed at the last position only. ``prefix``: the
    rows follow these shared tokens (run once, their keys and values reused; the padding sits after them)."""
    before = 0 if prefix is None else prefix.length
    positions = before + (mask.cumsum(1) - 1).clamp_min(0)
    attention = torch.cat([torch.ones(len(mask), before, dtype=mask.dtype), mask], 1)
    last = torch.tensor([ids.shape[1] - 1], device=lm.device)  # an index, not logits_to_keep=1 (see logits_at)
    out = []
    for start in range(0, ids.shape[0], batch_size):
        rows = slice(start, start + batch_size)
        cache = {} if prefix is None else {"cache": prefix.cache()}
        logits = lm.model(input_ids=ids[rows].to(lm.device), attention_mask=attention[rows].to(lm.device),
                          position_ids=positions[rows].to(lm.device), use_cache=prefix is not None,
                          logits_to_keep=last, **cache).logits
        out.append(torch.softmax(logits[:, -1].float(), dim=-1).cpu())
    return torch.cat(out)
