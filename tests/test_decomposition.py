"""ALTI, GlobEnc, attention rollout and ALTI-Logit (methods/decomposition.py): hand-computed toy models, the
decomposition's identities on five tiny architectures, and the rollout against the product of the layers."""

from __future__ import annotations

import math

import pytest
import torch

from conftest import ARCHS, build_tiny, peak_tensor_bytes
from llmattr import methods
from llmattr.api import prepare
from llmattr.errors import LlmattrError
from llmattr.faithfulness.alignment import per_layer_scores
from llmattr.methods import decomposition as dec
from llmattr.models.anatomy import decoder_blocks, final_norm
from llmattr.models.loading import LoadedModel, wrap_model
from llmattr.models.memory import Shapes, activation_bytes, plan
from llmattr.models.probe import Probe, eager_attention, repeat_heads
from llmattr.request import Request

TEXT = "the quick brown fox jumps over the lazy dog"


# --- the plain statement: every vector at once (the methods form them a tile at a time, or not at all) ---------


def transformed_vectors(layer: dec.Layer, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``T_i(x_j)`` ``(R, S, d)`` and ``y_i`` ``(R, d)`` at ``rows``, every vector formed:
    ``T_i(x_j) = P_i(sum_h A^h_ij u^h_j) + delta_ij x_i``, ``P_i`` the post-attention norm frozen at ``y_i``
    (identity without one), ``y_i = sum_j T_i(x_j) + P_i(b_O)``."""
    part = layer.part
    vectors = torch.einsum("hrs,shd->rsd", dec._probs(layer.record, rows), layer.u)
    if part.post_norm is not None:
        gain, scale, centred, bias = dec.post_attention(part, vectors.sum(1) + part.out_bias)
        vectors = dec._centred(vectors, centred) * (gain * scale)[:, None, :]
    else:
        bias = part.out_bias
    vectors[torch.arange(len(rows)), rows] += dec.wide(layer.residual[rows])
    return vectors, vectors.sum(1) + bias


def alti_rows(vectors: torch.Tensor, resultant: torch.Tensor) -> torch.Tensor:
    """ALTI (Ferrando et al. 2022, eqs. 8-9) from every vector: ``max(0, ||y_i||_1 - ||y_i - T_i(x_j)||_1)`` over its
    row sum, the proximity summed per coordinate by the library's :func:`dec.proximity`."""
    sign = torch.where(resultant >= 0, 1.0, -1.0).to(vectors.dtype)
    return dec._row_normalised(dec.proximity(vectors.clone(), sign[:, None], resultant.abs()[:, None]).clamp_min(0))


# --- hand-computed ----------------------------------------------------------------------------------------------


def test_alti_rows_by_hand():
    """T_1 = [3, 0], T_2 = [-1, 1], y = [2, 1]: ||y||_1 = 3, ||y - T_1||_1 = 2, ||y - T_2||_1 = 3, so ALTI gives
    proximities [1, 0] -> [1, 0]."""
    vectors = torch.tensor([[[3.0, 0.0], [-1.0, 1.0]]])
    torch.testing.assert_close(alti_rows(vectors, vectors.sum(1)), torch.tensor([[1.0, 0.0]]))


def test_alti_proximity_keeps_the_precision_of_small_contributions():
    """y = [1e8, 1] in float32, T_0 = [1, 0]: ||y||_1 - ||y - T_0||_1 = 1 exactly, but both norms round to 1e8, so
    the difference of the two norms would be 0; the per-coordinate sum keeps it (row [1, 1e8] / (1e8 + 1))."""
    vectors = torch.tensor([[[1.0, 0.0], [1e8 - 1, 1.0]]])
    row = alti_rows(vectors, vectors.sum(1))[0]
    assert row[0] == pytest.approx(1e-8, rel=1e-3) and row[1] == pytest.approx(1.0)


def hand_gpt2(tiny_tokenizer, layers: int = 2):
    """GPT-2 with d = 2, one head, q = k = 0 (uniform attention over the visible keys), values = LN(x) (gain 1,
    bias 0, eps 0: in two dimensions LN([a, b]) = [1, -1] if a > b), W_O = I, MLP = 0, no positions. Tokens
    0, 1, 2 embed as [1, 0], [0, 2], [0, 1]; the head is tied to them."""
    from transformers import AutoModelForCausalLM, GPT2Config

    cfg = GPT2Config(vocab_size=3, n_embd=2, n_layer=layers, n_head=1, n_positions=8, layer_norm_epsilon=0.0,
                     bos_token_id=0, eos_token_id=0)
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager")
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
        model.transformer.wte.weight.copy_(torch.tensor([[1.0, 0.0], [0.0, 2.0], [0.0, 1.0]]))
        for block in model.transformer.h:
            for norm in (block.ln_1, block.ln_2):
                norm.weight.fill_(1.0)
            block.attn.c_attn.weight[:, 4:6] = torch.eye(2)  # value part of [q | k | v]
            block.attn.c_proj.weight.copy_(torch.eye(2))
        model.transformer.ln_f.weight.fill_(1.0)
    return wrap_model(model, tiny_tokenizer, model_id="hand-gpt2")


IDS = torch.tensor([[0, 1, 2]])


def test_one_layer_by_hand(tiny_tokenizer):
    """Row 2: v = [1,-1], [-1,1], [-1,1], A = 1/3 each, x_2 = [0, 1]. T_2(x_0) = [1/3,-1/3], T_2(x_1) = [-1/3,1/3],
    T_2(x_2) = [-1/3,4/3], y_2 = [-1/3,4/3]: ALTI proximities 0, 2/3, 5/3 -> [0, 2/7, 5/7]; GlobEnc norms
    sqrt 2/3, sqrt 2/3, sqrt 17/3; attention rollout 0.5 [1/3,1/3,1/3] + 0.5 [0,0,1]. Row 1: T_1(x_0) = [1/2,-1/2],
    T_1(x_1) = [-1/2,5/2], y_1 = [0, 2]: ALTI [0, 1]."""
    lm = hand_gpt2(tiny_tokenizer, layers=1)
    rows = torch.tensor([1, 2])
    alti = dec.contribution_rows(lm, IDS, rows, "alti", layer=0)
    torch.testing.assert_close(alti, torch.tensor([[0.0, 1.0, 0.0], [0.0, 2 / 7, 5 / 7]]))
    norms = torch.tensor([math.sqrt(2), math.sqrt(2), math.sqrt(17)])
    globenc = dec.contribution_rows(lm, IDS, rows[1:], "globenc", layer=0)
    torch.testing.assert_close(globenc, (norms / norms.sum())[None])
    attention = dec.contribution_rows(lm, IDS, rows[1:], "attention", layer=0)
    torch.testing.assert_close(attention, torch.tensor([[1 / 6, 1 / 6, 2 / 3]]))


def test_two_layers_by_hand(tiny_tokenizer):
    """Layer 2's inputs are layer 1's outputs [2,-1], [0,2], [-1/3,4/3] (same values after LN): its row 2 is
    ALTI [0, 2/9, 7/9], so the rollout row 2 is 2/9 [0,1,0] + 7/9 [0,2/7,5/7] = [0, 4/9, 5/9].

    ALTI-Logit of token 1 (U = [0, 2]) at row 2: the final LN frozen at h = [-2/3, 5/3] (std 7/6) maps an update v
    to 6/7 (v[1] - v[0]); both layers' updates [1/3,-1/3], [-1/3,1/3], [-1/3,1/3] give Delta = [-4/7, 4/7, 4/7],
    and Delta^0 + Delta^1 C^0 = [-8/7, 64/49, 48/49]."""
    lm = hand_gpt2(tiny_tokenizer, layers=2)
    row = torch.tensor([2])
    torch.testing.assert_close(dec.contribution_rows(lm, IDS, row, "alti", layer=1), torch.tensor([[0, 2 / 9, 7 / 9]]))
    torch.testing.assert_close(dec.contribution_rows(lm, IDS, row, "alti"), torch.tensor([[0.0, 4 / 9, 5 / 9]]))
    logit = dec.alti_logit(lm, IDS, row, torch.tensor([1]))
    torch.testing.assert_close(logit, torch.tensor([[-8 / 7, 64 / 49, 48 / 49]]))
    contrast = dec.alti_logit(lm, IDS, row, torch.tensor([1]), foil_id=torch.tensor(2))  # U_1 - U_2 = [0, 1]
    torch.testing.assert_close(contrast, logit / 2)


# --- identities on every architecture ---------------------------------------------------------------------------


CENTRED = "gemma3-layernorm"  # Gemma 3 with a LayerNorm after attention: the centring C of P_i is exercised


def build(arch: str, tokenizer) -> LoadedModel:
    """:func:`build_tiny`, or for :data:`CENTRED` a tiny Gemma 3 whose post-attention norms are LayerNorms with
    random gains (no architecture the tests build has a centring norm after attention; the norms' bias stays 0,
    like the tiny models' output biases: a bias is no token's contribution, and the logit test sums tokens')."""
    if arch != CENTRED:
        return build_tiny(arch, tokenizer)
    lm = build_tiny("gemma3", tokenizer)
    generator = torch.Generator().manual_seed(1)
    for block in decoder_blocks(lm.model):
        norm = torch.nn.LayerNorm(lm.config.hidden_size, eps=1e-6)
        with torch.no_grad():
            norm.weight.copy_(1 + 0.3 * torch.randn(norm.weight.shape, generator=generator))
        block.post_attention_layernorm = norm.requires_grad_(False).to(next(block.parameters()).device)  # as loaded
    return lm


def _ids(lm):
    return lm.tokenizer(TEXT, return_tensors="pt").input_ids.to(lm.device)


def _attention_updates(lm, ids):
    """Each block's attention update ``y - x`` (the attention module's output, after Gemma's post-attention norm)
    and the final norm's input, hooked from the model's own modules: ``({layer: (S, d)}, (S, d))``."""
    updates, final = {}, {}
    hooks = []
    for layer, block in enumerate(decoder_blocks(lm.model)):
        module = block.post_attention_layernorm if hasattr(block, "pre_feedforward_layernorm") else \
            getattr(block, "self_attn", None) or block.attn
        hooks.append(module.register_forward_hook(
            lambda m, a, out, layer=layer: updates.__setitem__(layer, (out[0] if isinstance(out, tuple) else out)[0])))
    norm = final_norm(lm.model)
    hooks.append(norm.register_forward_pre_hook(lambda m, a: final.__setitem__(0, a[0][0])))
    with torch.no_grad():
        lm.model(ids)
    for hook in hooks:
        hook.remove()
    return updates, final[0]


@pytest.mark.parametrize("arch", [*ARCHS, CENTRED])
def test_decomposition_rebuilds_the_block_and_rows_sum_to_one(arch, tiny_tokenizer):
    """sum_j T_i(x_j) + P_i(b_O) equals the residual stream after the attention block (hooked), for every row
    of both layers; ALTI, GlobEnc and attention-rollout rows sum to 1 over the visible keys and are 0 elsewhere
    (Gemma3's sliding window of 4 included)."""
    lm = build(arch, tiny_tokenizer)
    ids = _ids(lm)
    n = ids.shape[1]
    updates, _ = _attention_updates(lm, ids)
    tr = dec.trace(lm, ids, None, [0, 1], "alti")
    rows = torch.arange(n)
    for layer in (0, 1):
        vectors, resultant = transformed_vectors(dec.Layer(tr, lm, layer, "alti"), rows)
        expected = tr.inputs[layer].float() + updates[layer].float()
        scale = vectors.abs().sum(1).max()
        assert (resultant - expected).abs().max() <= 1e-5 * scale
        visible = tr.records[layer].visible_at(rows)[0]
        for kind in dec.KINDS:
            c = dec.Layer(tr, lm, layer, kind).rows(rows)
            torch.testing.assert_close(c.sum(-1), torch.ones(n))
            assert (c[~visible] == 0).all() and (c >= 0).all()


def reference_matrices(lm, ids) -> dict[str, list[torch.Tensor]]:
    """Full (S, S) matrices of every layer, written from the papers' equations with whole (S, S, d) tensors as the
    authors' code does, from transformers' own eager attention weights, the hooked attention updates and the
    output projection's weight read by layout (no code of llmattr.methods.decomposition)."""
    with torch.no_grad(), eager_attention():
        out = lm.model(ids, output_attentions=True, output_hidden_states=True)
    with torch.no_grad(), Probe(record=("v",)) as probe:
        lm.model(ids)
    updates, _ = _attention_updates(lm, ids)
    cfg = lm.config.get_text_config()
    heads = cfg.num_attention_heads
    found: dict[str, list[torch.Tensor]] = {"alti": [], "globenc": [], "attention": []}
    for layer, block in enumerate(decoder_blocks(lm.model)):
        attn = getattr(block, "self_attn", None) or block.attn
        if hasattr(attn, "o_proj"):
            w = attn.o_proj.weight.T  # (H D, d)
        else:
            w = attn.c_proj.weight  # Conv1D: (H D, d)
        a = out.attentions[layer][0].float()  # (H, S, S)
        v = repeat_heads(probe.layers[layer].v, heads)[0].float()  # (H, S, D)
        per_head = torch.stack([v[h] @ w[h * v.shape[-1]:(h + 1) * v.shape[-1]].float() for h in range(heads)])
        vectors = torch.einsum("hij,hjd->ijd", a, per_head)  # (S, S, d)
        if hasattr(block, "pre_feedforward_layernorm"):  # Gemma: RMS statistics of the attention output
            raw = vectors.sum(1)
            vectors = vectors * (updates[layer].float() / raw)[:, None, :]
        x = out.hidden_states[layer][0].float()
        vectors = vectors + torch.diag_embed(x.T).permute(1, 2, 0)  # + delta_ij x_i
        y = x + updates[layer].float()
        prox = (y.abs().sum(-1)[:, None] - (y[:, None] - vectors).abs().sum(-1)).clamp_min(0)
        found["alti"].append(prox / prox.sum(-1, keepdim=True))
        norms = vectors.norm(dim=-1)
        found["globenc"].append(norms / norms.sum(-1, keepdim=True))
        found["attention"].append(0.5 * a.mean(0) + 0.5 * torch.eye(a.shape[-1], device=a.device))
    return found


@pytest.mark.parametrize("arch", ARCHS)
def test_layers_and_rollout_equal_the_reference(arch, tiny_tokenizer, monkeypatch):
    """Per layer, every row equals the full-tensor reference; the rollout of the explained rows equals the product
    of the reference's per-layer matrices, with blocks of 3 query rows (the block loop is exercised)."""
    lm = build_tiny(arch, tiny_tokenizer)
    ids = _ids(lm)
    n = ids.shape[1]
    width = {kind: dec.block_width(kind, Shapes.of(lm)) for kind in dec.KINDS}
    monkeypatch.setattr(dec, "BLOCK_BYTES", 3 * 4 * n * width["globenc"])
    assert [dec.block_rows(n, width[kind]) for kind in dec.KINDS] == [3, 3, 3], width
    reference = reference_matrices(lm, ids)
    positions = torch.tensor([n - 4, n - 1])
    for kind, matrices in reference.items():
        for layer, matrix in enumerate(matrices):
            torch.testing.assert_close(dec.contribution_rows(lm, ids, positions, kind, layer), matrix[positions],
                                       rtol=1e-4, atol=1e-5)
        product = matrices[1] @ matrices[0]
        torch.testing.assert_close(dec.contribution_rows(lm, ids, positions, kind), product[positions],
                                   rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("arch", [*ARCHS, CENTRED])
def test_alti_tiles_equal_the_reference(arch, tiny_tokenizer, monkeypatch):
    """ALTI's rows formed in tiles of 2 query rows by 3 keys (several tiles per row group, the last one partial;
    Gemma 3's window of 4 skips the keys before it) equal the plain statement (every vector formed) and, where the
    post-attention norm is an RMSNorm or absent, the independent full-tensor reference (whose RMS reading cannot
    hold a centring norm's mean and bias) on every row of both layers; ``y_i`` from the attention output
    (:func:`dec.block_resultant`, no vector formed) equals the sum of the transformed vectors
    ``sum_j T_i(x_j) + P_i(b_O)``."""
    lm = build(arch, tiny_tokenizer)
    ids = _ids(lm)
    n = ids.shape[1]
    monkeypatch.setattr(dec, "TILE_ROWS", 2)
    monkeypatch.setattr(dec, "TILE_BYTES", 4 * 2 * 3 * lm.config.hidden_size)
    assert dec.tile_shape(n, n, lm.config.hidden_size) == (2, 3)
    reference = None if arch == CENTRED else reference_matrices(lm, ids)["alti"]
    tr = dec.trace(lm, ids, None, [0, 1], "alti")
    rows = torch.arange(n)
    for layer in (0, 1):
        decomposition = dec.Layer(tr, lm, layer, "alti")
        tiled = decomposition.rows(rows)
        if reference is not None:
            torch.testing.assert_close(tiled, reference[layer], rtol=1e-4, atol=1e-5)
        vectors, resultant = transformed_vectors(decomposition, rows)
        torch.testing.assert_close(tiled, alti_rows(vectors, resultant), rtol=1e-4, atol=1e-5)
        probs = dec._probs(decomposition.record, rows)
        from_output, _, _ = dec.block_resultant(decomposition.record, decomposition.part, decomposition.residual,
                                                rows, probs)
        assert (from_output - resultant).abs().max() <= 1e-5 * vectors.abs().sum(1).max()


@pytest.mark.parametrize("arch", [*ARCHS, CENTRED])
def test_logit_updates_equal_the_vectors_along_the_direction(arch, tiny_tokenizer):
    """``Delta_ij = sum_h A^h_ij (u^h_j . C(g s_i w_i))`` (:meth:`dec.Layer.logit_updates`, no vector formed)
    equals the transformed vectors without the residual, ``T_i(x_j) - delta_ij x_i``, dotted with ``w_i``."""
    lm = build(arch, tiny_tokenizer)
    ids = _ids(lm)
    n = ids.shape[1]
    tr = dec.trace(lm, ids, None, [0, 1], "alti")
    rows = torch.tensor([0, n // 2, n - 1])
    direction = torch.randn(len(rows), lm.config.hidden_size, generator=torch.Generator().manual_seed(0)).to(lm.device)
    for layer in (0, 1):
        decomposition = dec.Layer(tr, lm, layer, "alti")
        vectors, _ = transformed_vectors(decomposition, rows)
        vectors[torch.arange(len(rows)), rows] -= tr.inputs[layer][rows].float()
        expected = torch.einsum("rjd,rd->rj", vectors, direction)
        torch.testing.assert_close(decomposition.logit_updates(rows, direction), expected, rtol=1e-4,
                                   atol=1e-5 * expected.abs().max().item())


@pytest.mark.parametrize("arch", [*ARCHS, CENTRED])
def test_alti_logit_sums_to_the_attention_updates_of_the_logit(arch, tiny_tokenizer):
    """ALTI rows sum to 1, so the ALTI-Logit scores of a row sum to U_w . F(sum_l (y^l - x^l)): the attention
    blocks' share of the target logit through the final norm frozen at that row (the norm's own gain over the
    centred state), from hooked updates."""
    lm = build(arch, tiny_tokenizer)
    ids = _ids(lm)
    n = ids.shape[1]
    positions = torch.tensor([n - 3, n - 1])
    targets = torch.tensor([5, 9])
    scores = dec.alti_logit(lm, ids, positions, targets)
    updates, final = _attention_updates(lm, ids)
    total = sum(updates[k][positions].float() for k in updates)
    norm = final_norm(lm.model)
    h = final[positions].float()
    with torch.no_grad():
        normed = norm(final[positions]).float()
    if isinstance(norm, torch.nn.LayerNorm):
        centred = h - h.mean(-1, keepdim=True)
        frozen = (normed - norm.bias.float()) / centred * (total - total.mean(-1, keepdim=True))
    else:
        frozen = normed / h * total
    head = lm.model.get_output_embeddings().weight[targets].float()
    expected = (frozen * head).sum(-1)
    scale = scores.abs().sum(-1)
    assert ((scores.sum(-1) - expected).abs() <= 1e-4 * scale).all()


# --- the registered methods ------------------------------------------------------------------------------------


def test_methods_run_stepwise_and_per_layer(tiny_lm):
    """Every method gives (steps, span) scores through the registry; layer=l equals that layer's row; per-layer
    alignment (faithfulness.alignment.per_layer_scores) takes ALTI- and GlobEnc- like NormXLogit."""
    target = prepare(tiny_lm, TEXT, Request("generate", answer=" the fox"))
    a, b = target.span
    for name in ("alti", "globenc", "attention-rollout", "alti-logit"):
        scores = methods.get(name).attribute(tiny_lm, target)
        assert scores.shape == (target.n_steps, b - a) and torch.isfinite(scores).all()
    last = dec.contribution_rows(tiny_lm, target.input_ids, target.positions, "alti", layer=1)[:, a:b]
    torch.testing.assert_close(methods.get("alti", layer=-1).attribute(tiny_lm, target), last)
    for name in ("alti", "globenc"):
        per_layer = per_layer_scores(tiny_lm, target, name)
        assert per_layer.shape == (2, b - a)


def test_parameters_and_decompx_are_checked_up_front():
    with pytest.raises(LlmattrError, match="integer layer"):
        methods.get("alti", layer="last")
    with pytest.raises(LlmattrError, match="explains a logit"):
        methods.get("alti-logit", target="probability")
    with pytest.raises(LlmattrError, match="decompx is not defined for decoder-only models: DecompX"):
        methods.get("decompx")
    assert "decompx" not in methods.available()


def test_memory_guard_counts_the_records(tiny_llama, monkeypatch):
    """The rollout keeps every layer's q, k, v and block input: more than one layer's, and a limit below it is
    refused with one line before any forward."""
    rollout, one = methods.get("alti"), methods.get("alti", layer=0)
    assert rollout.memory_extra(tiny_llama, 4096) > one.memory_extra(tiny_llama, 4096) > dec.BLOCK_BYTES
    monkeypatch.setenv("LLMATTR_MEMORY_LIMIT", "64MB")
    with pytest.raises(LlmattrError, match="alti on 4,096 tokens needs"):
        plan(tiny_llama, rollout, 4096)


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_memory_guard_covers_the_tensors_alive(arch, tiny_tokenizer, monkeypatch):
    """For each method, at two lengths (one block of query rows per layer at the shorter, several at the longer:
    ``BLOCK_BYTES`` lowered to 1 MiB), the tensors alive at the peak (profiled on the CPU, the allocator's peak
    on CUDA) stay within the memory guard's estimate for the same call (the forward's activations plus
    ``memory_extra``, :func:`dec.memory_bytes`), and the estimate is within 3 times of them."""
    lm = build_tiny(arch, tiny_tokenizer)
    monkeypatch.setattr(dec, "BLOCK_BYTES", 2**20)
    targets = [prepare(lm, " ".join([TEXT] * k), Request("generate", answer=" the")) for k in (2, 12)]
    lengths = [int(t.input_ids.shape[1]) for t in targets]
    alti = dec.block_width("alti", Shapes.of(lm))
    assert dec.block_rows(lengths[0], alti) >= lengths[0] and lengths[1] > 2 * dec.block_rows(lengths[1], alti)
    for name in ("alti", "globenc", "attention-rollout", "alti-logit"):
        method = methods.get(name)
        assert method.memory_kind == "forward" and method.memory_rows(lm, 1) == 1
        for target, n in zip(targets, lengths, strict=True):
            assert target.n_steps == 1
            estimate = activation_bytes(Shapes.of(lm), "forward", n) + method.memory_extra(lm, n)
            peak = peak_tensor_bytes(lambda m=method, t=target: m.attribute(lm, t))
            assert peak <= estimate <= 3 * peak, (name, n, peak, estimate)
