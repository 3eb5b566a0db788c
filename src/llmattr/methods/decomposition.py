"""Vector decomposition of the attention block: ALTI, GlobEnc, attention rollout and ALTI-Logit.

A pre-norm decoder block l writes, at position i, the attention block's output (before the MLP)

    y_i = x_i + P_i( sum_j sum_h A^h_ij v^h_j W_O^h + b_O )

with ``x`` the block input (the residual stream), ``A^h`` head h's attention probabilities, ``v^h_j`` the value
vector of key j (the block's input norm, its value projection and its bias inside), ``W_O^h`` head h's rows of
the output projection and ``P_i`` the post-attention norm where the block has one (Gemma 2/3), taken as linear
with its statistics frozen at row i (identity elsewhere). Splitting the sum by key gives the *transformed
vectors* (Kobayashi et al. 2020; Ferrando et al. 2022, eq. 6)

    T_i(x_j) = P_i( sum_h A^h_ij v^h_j W_O^h ) + delta_ij x_i,        y_i = sum_j T_i(x_j) + P_i(b_O).

Each method turns them into a row-stochastic contribution matrix ``C^l`` (rows: query i, columns: key j):

* **ALTI** (Ferrando et al. 2022, eqs. 8-9): proximity ``max(0, ||y_i||_1 - ||y_i - T_i(x_j)||_1)``, each row
  divided by its sum;
* **GlobEnc** (Modarressi et al. 2022, N_Enc): ``||T_i(x_j)||_2``, each row divided by its sum (a pre-norm block
  has no norm after the residual, so GlobEnc's two LayerNorm steps have nothing to act on here);
* **attention rollout** (Abnar & Zuidema 2020): ``0.5 mean_h A^h + 0.5 I``.

``layer=l`` returns row ``p_t`` of ``C^l`` for each explained step's predicting position ``p_t`` (paper 003's
per-layer "ALTI-" and "GlobEnc-", sec. 5.1); by default the layers are aggregated by rollout,
``R = C^{L-1} C^{L-2} ... C^0`` (Abnar & Zuidema 2020, eq. 1), row ``p_t`` of R.

**ALTI-Logit** (Ferrando et al. 2023, sec. 3) explains the target logit through the residual stream: layer l's
attention block adds to the logit of token w at position i

    Delta^l_{w <- j} = (F_i( T_i(x_j) - delta_ij x_i )) . U_w

(``U_w`` the unembedding row of w, ``F_i`` the final norm with its statistics frozen at row i), and each
layer's update is traced to the input tokens through the ALTI rollout of the layers below it:
``logit_{w <- x} = sum_l Delta^l R^{l-1}`` with ``R^{-1} = I``. The contrastive objective (``objective=contrast``)
explains ``z_w - z_f`` with ``U_w - U_f``.

Precision: float32 (float64 for a float64 model, except the attention probabilities, which
:func:`~..models.probe.attention_probs` takes in float32 whatever the dtype). ALTI's proximity
``||y_i||_1 - ||y_i - T_i(x_j)||_1`` is a difference of two nearly equal numbers when ``T_i(x_j)`` is small beside
the residual; :func:`proximity` sums it per coordinate without that cancellation.

Cost: no tensor of size ``S x S``. One forward records q, k and v of every layer (linear in ``S``; attention
rollout: q and k); the rollout runs top-down, ``r <- r C^l`` with ``r`` the ``(T, S)`` rows of the explained
steps, and ``C^l`` is built a block of query rows at a time (at most ``BLOCK_BYTES`` of float32 numbers,
``rows x S x`` :func:`block_width`); one layer's output projection and ``u^h_j`` are alive at a time. The
per-layer variants need the explained rows only. :func:`memory_bytes` counts what is alive at the peak.
Compute: every layer's attention scores recomputed, ``L S^2 H D`` multiply-adds (attention rollout: that alone);
ALTI's L1 distances need every (i, j) vector, ``L S^2 H d``, halved by skipping the keys a row cannot see, formed
a cache-sized tile at a time (:func:`alti_proximities`; ALTI-Logit's updates need none); GlobEnc's norms come
from per-key Gram matrices of the heads' outputs, ``L S^2 H^2``.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

from ..errors import LlmattrError
from ..lazy import torch
from ..models.anatomy import attention_parts, decoder_blocks, final_norm, output_head
from ..models.intercept import Patched
from ..models.loading import LoadedModel
from ..models.memory import Shapes
from ..models.probe import LayerRecord, Probe, attention_probs, repeat_heads
from ..targets import Target
from .base import NOT_DEFINED, AttributionMethod, choice, register

BLOCK_BYTES = 2**27  # float32 bytes one block of query rows holds at most: rows x S x block_width(kind)
TILE_BYTES = 2**21  # float32 bytes of one tile of ALTI's transformed vectors (rows x keys x d): cache-sized
TILE_ROWS = 64  # query rows of a tile
KINDS = ("alti", "globenc", "attention")


def wide(x: torch.Tensor) -> torch.Tensor:
    """``x`` in float32, or float64 if it is (the decomposition never computes below float32)."""
    return x.to(torch.promote_types(x.dtype, torch.float32))


# --- the model's pieces -------------------------------------------------------------------------------------------


@dataclass
class LayerParts:
    """What a layer's decomposition reads beside the probe: ``W_O`` per head ``(H, D, d)`` and ``b_O`` ``(d,)``
    (float32), and the post-attention norm (Gemma's sandwich norm; ``None`` for Llama, Qwen2, Mistral, GPT-2)."""

    out_proj: torch.Tensor
    out_bias: torch.Tensor
    post_norm: torch.nn.Module | None


def out_projection(proj: torch.nn.Module, heads: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(W_O (H, D, d), b_O (d,))`` of any linear map (``nn.Linear``, GPT-2's ``Conv1D``): ``b_O = proj(0)`` and
    the rows of ``W_O`` are ``proj(e_k) - b_O``, so no layout of the weight is assumed."""
    n_in = getattr(proj, "in_features", None) or proj.nx  # nn.Linear or Conv1D
    param = next(proj.parameters())
    with torch.no_grad():
        bias = wide(proj(torch.zeros(1, n_in, dtype=param.dtype, device=param.device))[0])
        weight = wide(proj(torch.eye(n_in, dtype=param.dtype, device=param.device))) - bias
    return weight.reshape(heads, n_in // heads, -1), bias


def layer_part(lm: LoadedModel, layer: int) -> LayerParts:
    """Block ``layer``'s :class:`LayerParts` (built when the layer is decomposed, so one layer's float32 ``W_O``
    is alive at a time), its parts found by :func:`~..models.anatomy.attention_parts`."""
    proj, post_norm = attention_parts(lm.model, decoder_blocks(lm.model)[layer])
    weight, bias = out_projection(proj, lm.config.get_text_config().num_attention_heads)
    return LayerParts(weight, bias, post_norm)


def frozen_norm(module: torch.nn.Module, states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """The linear part of a norm with its statistics frozen at ``states`` ``(R, d)``: ``v -> gain * C(v) * scale``.

    Returns ``(gain (d,), scale (R, 1), centred)``. LayerNorm: ``gain = gamma``, ``C`` subtracts the mean,
    ``scale = 1 / sqrt(var(x) + eps)``. RMSNorm (any variant: Llama's ``w``, Gemma's ``1 + w``): ``C`` is the
    identity, ``scale = 1 / sqrt(mean(x^2) + eps)`` and ``gain = norm(1) sqrt(1 + eps)`` (the norm of the all-ones
    vector, whose mean square is 1), so the gain is read from the module itself.
    """
    states = wide(states)
    if isinstance(module, torch.nn.LayerNorm):
        gain = wide(module.weight) if module.weight is not None else torch.ones_like(states[0])
        return gain, torch.rsqrt(states.var(-1, unbiased=False, keepdim=True) + module.eps), True
    eps = getattr(module, "variance_epsilon", None) or getattr(module, "eps", 1e-6)
    param = next(module.parameters())
    with torch.no_grad():
        ones = torch.ones(1, states.shape[-1], dtype=param.dtype, device=param.device)
        gain = wide(module(ones)[0]) * (1.0 + eps) ** 0.5
    return gain, torch.rsqrt(states.pow(2).mean(-1, keepdim=True) + eps), False


# --- one forward: the recordings ------------------------------------------------------------------------------


@dataclass
class Trace:
    """One forward's recordings: the probe's q (at ``rows``), k and v per layer (attention rollout: no v), every
    block's input ``(S, d)`` (not for the rollout) and the final norm's input ``(S, d)`` (the residual stream after
    the last block)."""

    records: dict[int, LayerRecord]
    inputs: dict[int, torch.Tensor]
    final: torch.Tensor | None


def _keeping(store: dict[int, torch.Tensor], key: int, forward, *args, **kwargs):
    """A module's forward that first keeps its first input (batch row 0) in ``store[key]``."""
    hidden = args[0] if args else kwargs["hidden_states"]
    store[key] = hidden[0].detach()
    return forward(*args, **kwargs)


def _traced_block(probe: Probe, inputs: dict[int, torch.Tensor] | None, layer: int, forward, *args, **kwargs):
    """Block ``layer``'s forward keeping its input in ``inputs`` (unless ``None``); afterwards its recorded k and v
    get storages of their own size where they are views of a larger one (a fused q/k/v projection, GPT-2's
    ``c_attn``, would keep its whole ``(S, 3 d)`` output)."""
    out = forward(*args, **kwargs) if inputs is None else _keeping(inputs, layer, forward, *args, **kwargs)
    record = probe.layers.get(layer)
    for name in ("k", "v"):
        x = getattr(record, name, None)
        if x is not None and x.untyped_storage().nbytes() > x.numel() * x.element_size():
            setattr(record, name, x.clone())
    return out


def trace(lm: LoadedModel, input_ids: torch.Tensor, rows: torch.Tensor | None, layers: list[int], kind: str,
          final: bool = False) -> Trace:
    """Run the model once (no LM head) recording what the decomposition of ``layers`` by ``kind`` needs; q only at
    ``rows`` (``None``: every row, for a rollout); the final norm's input with ``final``."""
    blocks = decoder_blocks(lm.model)
    inputs: dict[int, torch.Tensor] = {}
    rollout = kind == "attention"  # probabilities only: no values, no residual stream
    with torch.no_grad(), Probe(record=("q", "k") if rollout else ("q", "k", "v"), rows=rows, layers=layers) as probe:
        kept = None if rollout else inputs
        traced = Patched([blocks[k] for k in layers],
                         lambda k, forward: partial(_traced_block, probe, kept, layers[k], forward))
        last = Patched([final_norm(lm.model)] if final else [],
                       lambda _, forward: partial(_keeping, inputs, -1, forward))
        with traced, last:
            lm.model.base_model(input_ids=input_ids.to(lm.device), use_cache=False)
    return Trace(probe.layers, inputs, inputs.pop(-1, None))


# --- one layer: contribution rows ------------------------------------------------------------------------------


def _probs(record: LayerRecord, rows: torch.Tensor) -> torch.Tensor:
    """Attention probabilities ``(H, R, S)`` (float32) of absolute query positions ``rows``."""
    index = torch.searchsorted(record.rows, rows.to(record.rows.device))
    q = record.q[:, :, index]
    return wide(attention_probs(q, record.keys(), record.visible_at(rows), record.scaling, record.softcap)[0])


def _heads_out(record: LayerRecord, part: LayerParts) -> torch.Tensor:
    """``u^h_j = v^h_j W_O^h``: ``(S, H, d)`` float32, keys first (the layout the tiles' product reads), one head
    at a time (no repeated values for GQA, no second copy in another layout)."""
    weight = part.out_proj.to(record.v.device)
    heads, _, hidden = weight.shape
    values = record.v[0]  # (H_kv, S, D)
    groups = heads // values.shape[0]
    u = weight.new_empty(values.shape[1], heads, hidden)
    for h in range(heads):
        u[:, h] = wide(values[h // groups]) @ weight[h]
    return u


def post_attention(part: LayerParts, attn: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, bool, torch.Tensor]:
    """``P_i`` for rows whose attention output (``W_O`` applied, bias included) is ``attn`` ``(R, d)``:
    ``P_i(v) = gain * scale_i * C(v)`` as ``(gain (d,), scale (R, 1), centred, P_i(b_O) (R, d))`` (the identity
    without a post-attention norm)."""
    if part.post_norm is None:
        return torch.ones_like(attn[0]), torch.ones_like(attn[:, :1]), False, part.out_bias.expand_as(attn)
    gain, scale, centred = frozen_norm(part.post_norm, attn)
    bias = part.out_bias - part.out_bias.mean() if centred else part.out_bias
    shift = getattr(part.post_norm, "bias", None)
    return gain, scale, centred, gain * scale * bias + (0 if shift is None else wide(shift))


def _centred(x: torch.Tensor, centred: bool) -> torch.Tensor:
    return x - x.mean(-1, keepdim=True) if centred else x


def head_grams(part: LayerParts, u: torch.Tensor) -> torch.Tensor:
    """GlobEnc's per-key Gram matrices ``G_j = (g C(u_j))(g C(u_j))^T`` ``(S, H, H)`` of the heads' outputs ``u``
    ``(S, H, d)``, with ``g``/``C`` the post-attention norm's gain and centring (``g = 1``, ``C = I`` without one):
    computed once per layer, shared by every block of rows."""
    if part.post_norm is None:
        heads = u
    else:
        gain, _, centred = frozen_norm(part.post_norm, u[:1, 0])  # gain, centring: the module's own
        heads = _centred(u, centred) * gain
    return torch.bmm(heads, heads.transpose(1, 2))


def globenc_norms(record: LayerRecord, part: LayerParts, residual: torch.Tensor, rows: torch.Tensor,
                  u: torch.Tensor, gram: torch.Tensor) -> torch.Tensor:
    """``||T_i(x_j)||_2`` ``(R, S)`` without forming the vectors: off the diagonal
    ``||P_i(sum_h A^h_ij u^h_j)||^2 = s_i^2 sum_{h,h'} A^h_ij A^h'_ij G_j[h, h']`` with the per-key Gram matrix
    ``G_j`` of :func:`head_grams` (``H x H``), since ``P_i`` is a per-dimension gain ``g`` times a per-row scalar
    ``s_i``; the diagonal, which adds ``x_i``, directly. ``S H^2`` per row instead of ``S H d``."""
    probs = _probs(record, rows)  # (H, R, S)
    values = wide(repeat_heads(record.v, probs.shape[0])[0])
    attn = torch.einsum("hrk,hkd->rd", probs @ values, part.out_proj.to(values)) + part.out_bias
    gain, scale, centred, _ = post_attention(part, attn)
    per_key = probs.permute(2, 1, 0).contiguous()  # (S, R, H)
    squared = (torch.bmm(per_key, gram) * per_key).sum(-1).T * scale**2
    index = torch.arange(len(rows))
    diagonal = torch.einsum("hr,rhd->rd", probs[:, index, rows], u[rows])
    diagonal = _centred(diagonal, centred) * gain * scale + wide(residual[rows])
    squared[index, rows] = diagonal.pow(2).sum(-1)
    return squared.clamp_min(0).sqrt()


def attention_output(record: LayerRecord, part: LayerParts, probs: torch.Tensor) -> torch.Tensor:
    """``sum_j sum_h A^h_ij u^h_j = sum_h (A^h v^h) W_O^h`` ``(R, d)`` (no bias, no post-attention norm) from
    ``probs`` ``(H, R, S)``: the sum over the keys taken before the output projection, ``R S H D + R H D d``
    multiply-adds, no ``(R, S, d)`` vector. GQA: the query heads of a key/value head share its values, so
    ``probs`` is read as ``(H_kv, groups R, S)`` (a view) and the values are not repeated."""
    heads, n_rows, n_keys = probs.shape
    values = wide(record.v[0])  # (H_kv, S, D)
    mixed = probs.reshape(values.shape[0], -1, n_keys) @ values  # (H_kv, groups R, D)
    return torch.einsum("hrd,hde->re", mixed.reshape(heads, n_rows, -1), part.out_proj.to(mixed))


def block_resultant(record: LayerRecord, part: LayerParts, residual: torch.Tensor, rows: torch.Tensor,
                    probs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """``y_i = x_i + P_i(sum_j sum_h A^h_ij u^h_j + b_O)`` ``(R, d)`` from :func:`attention_output` (the sum over
    ``j`` of the transformed vectors, ``y_i = sum_j T_i(x_j) + P_i(b_O)``, without forming them) and the factor
    ``gain * scale_i`` ``(R, d)`` of ``P_i`` (ones without a post-attention norm) and whether ``P_i`` centres."""
    raw = attention_output(record, part, probs)
    gain, scale, centred, bias = post_attention(part, raw + part.out_bias)
    factor = gain * scale
    return _centred(raw, centred) * factor + bias + wide(residual[rows]), factor, centred


def proximity(vectors: torch.Tensor, sign: torch.Tensor, magnitude: torch.Tensor) -> torch.Tensor:
    """``||y||_1 - ||y - T||_1`` over the last axis of ``vectors`` (overwritten), unclipped, from ``sign`` and
    ``magnitude`` ``|y_k|`` broadcast against them: ``sign`` is ``sign(y_k)`` for vectors ``T``, or any factor that
    turns the given vectors into ``t_k = sign(y_k) T_k`` (ALTI's tiles: ``g_k s_i sign(y_k)`` on the unscaled ones).

    Summed per coordinate without cancellation: with ``a_k = |y_k|`` and ``t_k = sign(y_k) T_k``,
    ``|y_k| - |y_k - T_k| = t_k`` where ``t_k <= a_k`` and ``2 a_k - t_k`` where ``t_k > a_k``, i.e.
    ``t_k - 2 max(0, t_k - a_k)``; so a small ``T`` beside a large residual keeps its own precision instead of
    the rounding of ``||y||_1``. Over ``d``: ``sum_k t_k - 2 sum_k max(0, t_k - a_k)``, in place.
    """
    t = vectors.mul_(sign)
    signed = t.sum(-1)
    return signed - 2 * t.sub_(magnitude).clamp_min_(0).sum(-1)


def tile_shape(rows: int, keys: int, hidden: int, element: int = 4) -> tuple[int, int]:
    """``(query rows, keys)`` of one tile of transformed vectors: ``TILE_ROWS`` rows (fewer if the block has fewer)
    and as many keys as keep ``rows x keys x d`` numbers within ``TILE_BYTES`` (at least 1, at most ``keys``)."""
    rows = min(rows, TILE_ROWS)
    return rows, min(keys, max(1, TILE_BYTES // (element * rows * hidden)))


def alti_proximities(record: LayerRecord, part: LayerParts, residual: torch.Tensor, rows: torch.Tensor,
                     u: torch.Tensor) -> torch.Tensor:
    """ALTI's proximities ``max(0, ||y_i||_1 - ||y_i - T_i(x_j)||_1)`` ``(R, S)`` (eqs. 8-9, unnormalised) of
    absolute positions ``rows``, the vectors formed a tile at a time (:func:`tile_shape`: a few query rows by a
    few keys, ``TILE_BYTES``, so that each of :func:`proximity`'s passes over them reads the cache, not memory).

    * ``y_i`` first, from :func:`block_resultant` (no vector needed), so each tile is complete on its own;
    * off the diagonal ``T_i(x_j) = g s_i C(sum_h A^h_ij u^h_j)`` (``P_i`` as gain ``g``, per-row scale ``s_i``
      and centring ``C``; ``g s_i = 1``, ``C = I`` without a post-attention norm): a batched ``(rows, H) @ (H, d)``
      product per key on the tile's slice of a heads-last copy of the probabilities, then ``g s_i sign(y_i)`` in one
      multiply (``sign(y_i)`` cannot enter the product's operands: it scales each ``(rows, d)`` output of the
      per-key ``(rows, H) @ (H, d)`` coordinate by coordinate);
    * keys whose probability is 0 for every head and row of a tile have ``T_i(x_j) = 0`` and proximity
      ``-2 sum_k max(0, -|y_k|) = 0``: a tile's keys run from its first to its last key with a non-zero
      probability (causal masking halves the work; sliding windows skip more);
    * the diagonal ``T_i(x_i)`` (which adds ``x_i``) is formed per row and overwrites the tile's value.
    """
    probs = _probs(record, rows)  # (H, R, S)
    resultant, factor, centred = block_resultant(record, part, residual, rows, probs)
    sign = torch.where(resultant >= 0, 1.0, -1.0).to(resultant.dtype)
    magnitude = resultant.abs()
    del resultant
    factor = factor * sign  # g s_i sign(y_i): the vectors' scale and the sign of t in one factor
    heads, n_rows, n_keys = probs.shape
    index = torch.arange(n_rows, device=rows.device)
    reach = probs.amax(0) > 0  # (R, S): keys with a non-zero probability in some head
    # (R, S, H), heads last: a tile's (keys, rows, H) operand is a view the batched product reads as it is (one
    # transpose of an (H, R S) matrix: half the time of a copy in an (S, R, H) layout, on SmolLM2)
    probs = probs.view(heads, -1).T.contiguous().view(n_rows, n_keys, heads)
    tile_rows, tile_keys = tile_shape(n_rows, n_keys, u.shape[-1], u.element_size())
    buffer = u.new_empty(tile_keys, tile_rows, u.shape[-1])
    out = u.new_zeros(n_rows, n_keys)
    for r in index.split(tile_rows):
        a, b = int(r[0]), int(r[-1]) + 1
        live = torch.nonzero(reach[a:b].any(0))
        for k in range(int(live[0]), int(live[-1]) + 1, tile_keys) if len(live) else ():
            j = slice(k, min(k + tile_keys, n_keys))
            vectors = buffer.view(-1)[:(j.stop - k) * (b - a) * u.shape[-1]].view(j.stop - k, b - a, -1)
            torch.bmm(probs[a:b, j].transpose(0, 1), u[j], out=vectors)  # (keys, rows, d): sum_h A^h_ij u^h_j
            if centred:
                vectors.sub_(vectors.mean(-1, keepdim=True))
            out[a:b, j] = proximity(vectors, factor[a:b], magnitude[a:b]).T
        own = torch.einsum("rh,rhd->rd", probs[index[a:b], rows[a:b]], u[rows[a:b]])  # sum_h A^h_ii u^h_i
        own = _centred(own, centred) * factor[a:b] + wide(residual[rows[a:b]]) * sign[a:b]  # sign(y_i) T_i(x_i)
        out[a:b][index[:b - a], rows[a:b]] = proximity(own, 1.0, magnitude[a:b])
    return out.clamp_min_(0)


def _row_normalised(scores: torch.Tensor) -> torch.Tensor:
    total = scores.sum(-1, keepdim=True)
    return scores / torch.where(total > 0, total, torch.ones_like(total))


def rollout_attention_rows(probs: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """Abnar & Zuidema's residual-augmented attention ``0.5 mean_h A^h + 0.5 I`` at ``rows``: ``(R, S)``."""
    mixed = 0.5 * probs.mean(0)
    mixed[torch.arange(len(rows)), rows] += 0.5
    return mixed


def block_width(kind: str, shapes: Shapes) -> int:
    """Float32 numbers a block of query rows holds at once per (row, key), counted from the code: attention
    rollout the scores, a masked or softcapped copy and the probabilities (``3 H``); ALTI the same while its
    probabilities are computed, then the probabilities and their per-key copy (``2 H``) and, in ALTI-Logit's
    updates, the probabilities, the heads' dot products and their product (``3 H``) (its vectors exist a tile at
    a time only: :func:`alti_extra`); GlobEnc the probabilities, their per-key copy, its product with the Gram
    matrices and that product's square (``4 H``). Each ``+ 1``: the ``(R, S)`` visibility mask and rows."""
    return (4 if kind == "globenc" else 3) * shapes.heads + 1


def alti_extra(shapes: Shapes, tokens: int, rows: int) -> int:
    """Float32 numbers ALTI holds beside a block's ``rows x S x`` :func:`block_width`: per row of the block the
    heads' mixed values ``(H, D)`` or, after them, about five ``(R, d)`` vectors (the attention output, ``y_i``,
    its sign and magnitude, the factor ``g s_i sign(y_i)``, temporaries), and one tile of :func:`alti_proximities`
    (its vectors, beside them the tile's rows of ``u^h_i`` and a few ``(rows, d)`` and ``(keys, rows)`` vectors,
    and one ``(S,)`` maximum)."""
    tile_rows, tile_keys = tile_shape(rows, tokens, shapes.hidden, max(shapes.element, 4))
    per_row = max(shapes.heads * shapes.head_dim + shapes.hidden, 5 * shapes.hidden)
    tile = tile_rows * (tile_keys * (shapes.hidden + 4) + (shapes.heads + 4) * shapes.hidden) + tokens
    return rows * per_row + tile


def block_rows(tokens: int, width: int) -> int:
    """Query rows per block so that ``rows x S x width`` float32 numbers stay within ``BLOCK_BYTES``."""
    return max(1, BLOCK_BYTES // (4 * tokens * width))


class Layer:
    """One layer's decomposition over a :class:`Trace`: contribution rows of method ``kind`` for any rows, a block
    of :func:`block_rows` query rows at a time.

    What does not depend on the query rows (the output projection, ``u^h_j``, GlobEnc's Gram matrices) is computed
    once here; attention rollout needs none of it."""

    def __init__(self, tr: Trace, lm: LoadedModel, layer: int, kind: str):
        self.record, self.kind = tr.records[layer], kind
        self.residual = tr.inputs.get(layer)
        self.part = None if kind == "attention" else layer_part(lm, layer)
        self.u = None if kind == "attention" else _heads_out(self.record, self.part)
        self.gram = head_grams(self.part, self.u) if kind == "globenc" else None
        self.step = block_rows(self.record.k.shape[2], block_width(kind, Shapes.of(lm)))

    def _block(self, rows: torch.Tensor) -> torch.Tensor:
        if self.kind == "attention":
            return rollout_attention_rows(_probs(self.record, rows), rows)
        if self.kind == "globenc":
            return _row_normalised(globenc_norms(self.record, self.part, self.residual, rows, self.u, self.gram))
        return _row_normalised(alti_proximities(self.record, self.part, self.residual, rows, self.u))

    def rows(self, rows: torch.Tensor) -> torch.Tensor:
        """``C^l`` at absolute positions ``rows``: ``(R, S)``, each row summing to 1."""
        return torch.cat([self._block(block) for block in rows.split(self.step)])

    def times(self, r: torch.Tensor) -> torch.Tensor:
        """``r C^l`` for ``r`` ``(T, S)``, ``C^l`` built a block of query rows at a time (never ``(S, S)``)."""
        out = torch.zeros_like(r)
        for rows in torch.arange(r.shape[1], device=r.device).split(self.step):
            out += r[:, rows] @ self._block(rows)
        return out

    def logit_updates(self, rows: torch.Tensor, direction: torch.Tensor) -> torch.Tensor:
        """ALTI-Logit's ``Delta^l`` ``(R, S)`` at absolute positions ``rows`` with their logit directions ``w_i``
        ``(R, d)``: the transformed vectors without the residual, along the direction, without forming them.
        ``P_i(v) . w_i = (g s_i C(v)) . w_i = v . C(g s_i w_i)`` (``C`` is symmetric), so

            Delta_ij = w_i . P_i(sum_h A^h_ij u^h_j) = sum_h A^h_ij (u^h_j . w'_i),   w'_i = C(g s_i w_i),

        one ``(S H, d) @ (d, R)`` product and a sum over the heads, ``S H d`` per row instead of forming
        ``S d`` numbers with ``S H d`` (the diagonal too: the update leaves ``x_i`` out)."""
        out = []
        for index in torch.arange(len(rows), device=rows.device).split(self.step):
            block = rows[index]
            probs = _probs(self.record, block)  # (H, R, S)
            _, factor, centred = block_resultant(self.record, self.part, self.residual, block, probs)
            along = _centred(direction[index].to(factor) * factor, centred)  # w'_i (R, d)
            heads, n_rows, n_keys = probs.shape
            dots = (self.u.flatten(0, 1) @ along.T).view(n_keys, heads, n_rows)  # u^h_j . w'_i (S, H, R)
            out.append((probs * dots.permute(1, 2, 0)).sum(0))
        return torch.cat(out)


def contribution_rows(lm: LoadedModel, input_ids: torch.Tensor, positions: torch.Tensor, kind: str,
                      layer: int | None = None) -> torch.Tensor:
    """Row ``p_t`` of ``C^layer`` (``layer`` given) or of the rollout ``C^{L-1} ... C^0`` for every explained
    position: ``(T, S)``."""
    n_layers = lm.config.get_text_config().num_hidden_layers
    positions = positions.to(lm.device)
    if layer is not None:
        tr = trace(lm, input_ids, positions, [layer], kind)
        return Layer(tr, lm, layer, kind).rows(positions)
    tr = trace(lm, input_ids, None, list(range(n_layers)), kind)
    r = Layer(tr, lm, n_layers - 1, kind).rows(positions)
    for below in range(n_layers - 2, -1, -1):
        r = Layer(tr, lm, below, kind).times(r)
    return r


def logit_directions(lm: LoadedModel, target_ids: torch.Tensor, foil_id: torch.Tensor | None,
                     final: torch.Tensor) -> torch.Tensor:
    """``w'_t`` ``(T, d)`` with ``w'_t . v = F_{p_t}(v) . U_{y_t}`` (minus ``U_f`` if contrastive), ``F`` the final
    norm frozen at the explained rows ``final`` ``(T, d)``; the head's bias adds a constant and is left out."""
    head = output_head(lm.model).weight
    unembed = wide(head[target_ids.to(head.device)])
    if foil_id is not None:
        unembed = unembed - wide(head[foil_id.to(head.device)])
    norm = final_norm(lm.model)
    if norm is None:
        return unembed
    gain, scale, centred = frozen_norm(norm, final)
    direction = unembed * gain
    if centred:  # C is symmetric: (g * C(v)) . w = v . C(g * w)
        direction = direction - direction.mean(-1, keepdim=True)
    return direction * scale


def alti_logit(lm: LoadedModel, input_ids: torch.Tensor, positions: torch.Tensor, target_ids: torch.Tensor,
               foil_id: torch.Tensor | None = None) -> torch.Tensor:
    """ALTI-Logit (module docstring): ``sum_l Delta^l R^{l-1}`` rows ``(T, S)``, evaluated top-down as
    ``(((Delta^{L-1}) C^{L-2} + Delta^{L-2}) C^{L-3} + ...) C^0 + Delta^0`` (one layer's decomposition alive)."""
    n_layers = lm.config.get_text_config().num_hidden_layers
    positions = positions.to(lm.device)
    tr = trace(lm, input_ids, None, list(range(n_layers)), "alti", final=True)
    direction = logit_directions(lm, target_ids, foil_id, tr.final[positions])
    r = None
    for layer in range(n_layers - 1, -1, -1):
        decomposition = Layer(tr, lm, layer, "alti")
        delta = decomposition.logit_updates(positions, direction)
        r = delta if r is None else decomposition.times(r) + delta
        del decomposition  # before the next layer's is built
    return r


def memory_bytes(lm: LoadedModel, tokens: int, kind: str, all_layers: bool, logit: bool = False) -> int:
    """Bytes a decomposition of ``kind`` holds at its peak beside the forward's own (``e`` the model's bytes per
    element, ``w = max(e, 4)`` those of its float32 or float64 arithmetic):

    * the records, of every layer (``all_layers``: a rollout) or of one: q, k and v, ``S e (H + 2 H_kv) D``
      (attention rollout: q and k, ``S e (H + H_kv) D``), and the block input ``S e d`` (not for attention
      rollout); ALTI-Logit (``logit``): the final norm's input, ``S e d``;
    * one layer's output projection ``w (d + 1) d``, ``u^h_j`` ``w S H d`` and GlobEnc's Gram matrices
      ``w S H^2`` (none for the rollout), and each block's keys (and GlobEnc's values) repeated to the ``H`` query
      heads, ``2 w S H D``;
    * one block of query rows, ``w min(S, rows) S`` :func:`block_width` (at most ``BLOCK_BYTES``), and ALTI's
      per-row vectors and tile (:func:`alti_extra`).

    The ``(T, S)`` rows of the ``T`` explained steps are left out."""
    s = Shapes.of(lm)
    if kind == "attention":
        per_token, layer = (s.heads + s.kv_heads) * s.head_dim, 0
    else:
        per_token = (s.heads + 2 * s.kv_heads) * s.head_dim + s.hidden
        layer = (s.hidden + 1) * s.hidden + tokens * s.heads * (s.hidden + s.heads)
    records = tokens * s.element * ((s.layers if all_layers else 1) * per_token + (s.hidden if logit else 0))
    width = block_width(kind, s)
    rows = min(tokens, block_rows(tokens, width))
    block = rows * tokens * width + (alti_extra(s, tokens, rows) if kind == "alti" else 0)
    return records + max(s.element, 4) * (layer + 2 * tokens * s.heads * s.head_dim + block)


# --- the registered methods -----------------------------------------------------------------------------------------


def _layer_index(lm: LoadedModel, name: str, layer: int | None) -> int | None:
    if layer is None:
        return None
    n_layers = lm.config.get_text_config().num_hidden_layers
    if not -n_layers <= layer < n_layers:
        raise LlmattrError(f"{name} layer must be in [0, {n_layers - 1}] (or -1 for the last); got {layer}")
    return layer % n_layers


class _Decomposition(AttributionMethod):
    family = "vector decomposition"
    needs_gradients = False
    signed = False
    defaults = {"layer": None}
    rules = {"layer": ("layer-or", (None,),
                       "{name} layer must be an integer layer index (or absent for the rollout); got {value!r}")}
    kind: str

    def attribute(self, lm: LoadedModel, target: Target) -> torch.Tensor:
        a, b = target.span
        layer = _layer_index(lm, self.name, self.params.get("layer"))
        return contribution_rows(lm, target.input_ids, target.positions, self.kind, layer)[:, a:b].cpu()

    def memory_extra(self, lm: LoadedModel, tokens: int) -> int:
        return memory_bytes(lm, tokens, self.kind, self.params.get("layer") is None)


@register
class Alti(_Decomposition):
    """ALTI (Ferrando et al. 2022): Manhattan-distance contributions per layer, aggregated by rollout."""

    name = "alti"
    summary = "ALTI: L1-proximity contributions of the attention block, rollout over layers (layer=l: ALTI-)"
    cost = "1 forward; rollout: every (query, key) vector of every layer, L S^2 H d (layer=l: explained rows only)"
    kind = "alti"


@register
class GlobEnc(_Decomposition):
    """GlobEnc (Modarressi et al. 2022): norms of the decomposed attention block output, aggregated by rollout."""

    name = "globenc"
    summary = "GlobEnc: L2 norms of the decomposed attention block output, rollout over layers (layer=l: GlobEnc-)"
    cost = "1 forward; rollout: every layer's scores and per-key head Gram matrices, L S^2 H (D + H) (layer=l: " \
           "explained rows only)"
    kind = "globenc"


@register
class AttentionRollout(_Decomposition):
    """Attention rollout (Abnar & Zuidema 2020): product of ``0.5 mean_h A + 0.5 I`` over layers."""

    name = "attention-rollout"
    summary = "attention rollout: product over layers of 0.5 mean-head attention + 0.5 I (layer=l: that layer's)"
    cost = "1 forward; every layer's attention rows recomputed a block at a time, L S^2 H D"
    kind = "attention"


@register
class AltiLogit(AttributionMethod):
    """ALTI-Logit (Ferrando et al. 2023): each layer's attention update to the target logit, traced to the input
    tokens through the ALTI rollout of the layers below."""

    name = "alti-logit"
    family = "vector decomposition"
    summary = "ALTI-Logit: attention updates to the target logit traced to the inputs by ALTI rollout (signed)"
    needs_gradients = False
    signed = True
    cost = "1 forward; every (query, key) vector of every layer, L S^2 H d"
    objective = "logit"
    LINEAR = ("logit", "contrast")
    rules = {**_Decomposition.rules, "objective": choice(
        LINEAR, f"alti-logit explains a logit: objective must be one of {', '.join(LINEAR)}")}

    def attribute(self, lm: LoadedModel, target: Target) -> torch.Tensor:
        a, b = target.span
        _, foil = self.explained(lm)
        scores = alti_logit(lm, target.input_ids, target.positions, target.target_ids, foil)
        return scores[:, a:b].cpu()

    def memory_extra(self, lm: LoadedModel, tokens: int) -> int:
        return memory_bytes(lm, tokens, "alti", True, logit=True)


NOT_DEFINED["decompx"] = (
    "DecompX (Modarressi et al. 2023) propagates decomposed vectors through BERT-style post-norm encoders into a "
    "classification head (paper 003 reports N/A for Llama 2); alti-logit is the decoder counterpart")
