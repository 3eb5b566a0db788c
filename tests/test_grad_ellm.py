"""Grad-ELLM against paper 000 eqs. 9-11 / appendix B, recomputed by hand on a one-layer, one-head toy."""

import pytest
import torch

import llmattr
from conftest import build_tiny
from llmattr import methods
from llmattr.api import prepare
from llmattr.errors import LlmattrError
from llmattr.request import Request
from llmattr.tasks import get_task


def _toy(tokenizer):
    """One layer, one head GPT-2 (no RoPE) with the MLP switched off, so every step can be written out."""
    lm = build_tiny("gpt2", tokenizer, seed=3, n_layer=1, n_head=1, num_hidden_layers=1, num_attention_heads=1)
    mlp = lm.model.transformer.h[0].mlp
    for p in mlp.parameters():
        p.data.zero_()
    return lm


def _by_hand(lm, ids, t, target_id, attention):
    """H_i = ReLU(lambda_i * sum_c w_c v_ic), lambda = minmax(q_t . k_i) or softmax, w = dl_t/do_t."""
    tr = lm.model.transformer
    block = tr.h[0]
    x = tr.wte(ids[0]) + tr.wpe(torch.arange(ids.shape[1], device=ids.device))  # (S, d)
    h = block.ln_1(x)
    q, k, v = block.attn.c_attn(h).split(x.shape[-1], dim=-1)
    scores = q[t] @ k[: t + 1].T  # keys 0..t (causal)
    if attention == "loosened":
        lam = (scores - scores.min()) / (scores.max() - scores.min())
    else:
        lam = torch.softmax(scores / q.shape[-1] ** 0.5, dim=-1)
    o_t = (torch.softmax(scores / q.shape[-1] ** 0.5, -1)[:, None] * v[: t + 1]).sum(0).detach().requires_grad_(True)

    def logit(o):  # residual + o_proj, (zero) MLP, final norm, LM head
        z = x[t] + block.attn.c_proj(o)
        z = z + block.mlp(block.ln_2(z))
        return lm.model.lm_head(tr.ln_f(z))[target_id]

    (w,) = torch.autograd.grad(logit(o_t), o_t)
    return torch.relu(lam * (v[: t + 1] @ w)).detach()


@pytest.mark.parametrize("attention", ["loosened", "softmax"])
def test_grad_ellm_matches_hand_computation(tiny_tokenizer, attention):
    lm = _toy(tiny_tokenizer)
    target = prepare(lm, "An engrossing film that is never boring.", Request("generate", max_new_tokens=3))
    got = methods.get("grad-ellm", attention=attention).attribute(lm, target)
    a, b = target.span
    ids = target.input_ids.to(lm.device)
    for step in range(target.n_steps):
        t = int(target.positions[step])
        expected = _by_hand(lm, ids, t, int(target.target_ids[step]), attention)[a:b]
        expected = (expected - expected.min()) / (expected.max() - expected.min())
        torch.testing.assert_close(got[step], expected, atol=1e-5, rtol=1e-4)


def test_grad_ellm_layers_and_variants_change_the_map(tiny_tokenizer):
    lm = build_tiny("llama", tiny_tokenizer, num_hidden_layers=4)
    target = prepare(lm, "The movie was dull and the plot made no sense.", Request("sentiment", answer="Negative"))
    maps = {
        key: methods.get("grad-ellm", **params).attribute(lm, target)
        for key, params in {"all": {}, "last1": {"layers": 1}, "cos": {"similarity": "cosine"},
                            "after": {"relu": "after-sum"}}.items()
    }
    for key, value in maps.items():
        assert value.shape == (target.n_steps, target.span[1] - target.span[0]), key
        assert torch.all(value.amin(-1) == 0.0) and torch.all(value.amax(-1) == 1.0), key
    assert not torch.allclose(maps["all"], maps["last1"])
    assert not torch.allclose(maps["all"], maps["cos"])


def test_grad_ellm_last_layer_equals_sum_when_one_layer(tiny_tokenizer):
    lm = _toy(tiny_tokenizer)
    target = prepare(lm, "never boring", Request("generate", max_new_tokens=2))
    torch.testing.assert_close(methods.get("grad-ellm", layers=1).attribute(lm, target),
                               methods.get("grad-ellm").attribute(lm, target))


def test_multi_step_shares_one_backward_and_matches_single_steps(tiny_tokenizer):
    lm = build_tiny("mistral", tiny_tokenizer)
    task = get_task("generate")
    target = prepare(lm, "the quick brown fox", Request(task, max_new_tokens=4))
    together = methods.get("grad-ellm").attribute(lm, target)
    for step in range(target.n_steps):
        answer = lm.tokenizer.decode(target.target_ids[: step + 1])
        single = prepare(lm, "the quick brown fox", Request(task, answer=answer))
        if single.n_steps != step + 1:  # re-tokenising the decoded answer may merge tokens; skip those
            continue
        torch.testing.assert_close(methods.get("grad-ellm").attribute(lm, single)[step], together[step])


def test_bad_parameters_are_refused():
    for params in ({"attention": "hard"}, {"layers": 0}, {"similarity": "l2"}, {"relu": "none"}, {"k": 1}):
        with pytest.raises(LlmattrError):
            methods.get("grad-ellm", **params)


def test_explain_api_returns_scores_in_unit_interval(tiny_llama):
    expl = llmattr.explain("An engrossing film that is never boring.", model=tiny_llama, task="sentiment",
                           answer="Positive")
    scores = expl.score_matrix()
    assert scores.shape == (1, expl.span[1] - expl.span[0])
    assert float(scores.min()) >= 0 and float(scores.max()) <= 1
    assert expl.steps[0].token == "Positive" and expl.forced


def test_cosine_is_per_head_and_cosine_full_spans_every_head():
    """``cosine``: min-max over keys of cos(q_t^h, k_i^h) for each head h; ``cosine-full``: of the cosine of
    the concatenated heads, cos([q^1..q^H], [k^1..k^H]), the same weights for every head (Grad-ECLIP code)."""
    from types import SimpleNamespace

    from llmattr.methods.grad_ellm import token_weights

    gen = torch.Generator().manual_seed(0)
    q, k = torch.randn(1, 3, 6, 4, generator=gen), torch.randn(1, 3, 6, 4, generator=gen)
    t = 5
    record = SimpleNamespace(q=q[:, :, [t]], keys=lambda: k, visible=torch.ones(1, 1, 6, dtype=torch.bool))

    def minmax(v):
        return (v - v.min()) / (v.max() - v.min())

    per_head = token_weights(record, "loosened", "cosine")[0]  # (H, S)
    for h in range(3):
        cos = torch.nn.functional.cosine_similarity(q[0, h, t][None], k[0, h], dim=-1)
        torch.testing.assert_close(per_head[h], minmax(cos))
    full = token_weights(record, "loosened", "cosine-full")[0]
    wide_q, wide_k = q[0, :, t].reshape(-1), k[0].transpose(0, 1).reshape(6, -1)
    expected = minmax(torch.nn.functional.cosine_similarity(wide_q[None], wide_k, dim=-1))
    for h in range(3):
        torch.testing.assert_close(full[h], expected)
    assert not torch.allclose(full, per_head, atol=1e-2)
@pytest.mark.parametrize("attention", ["loosened", "softmax"])
def test_grad_ellm_gives_zero_outside_every_sliding_window(tiny_tokenizer, attention):
    """Tiny Gemma-3, window 16 in both layers: a query at position t sees keys t-15..t only, so every span token
    before that scores exactly 0 (loosened weights are min-max over the keys the layer's mask lets it see)."""
    lm = build_tiny("gemma3", tiny_tokenizer, sliding_window=16)
    assert set(lm.config.layer_types) == {"sliding_attention"}
    target = prepare(lm, "An engrossing film that is never boring, with a terrific cast.", Request("generate",
                     answer=" the quick"))
    a, b = target.span
    got = methods.get("grad-ellm", attention=attention).attribute(lm, target)
    for step in range(target.n_steps):
        first_seen = int(target.positions[step]) - lm.config.sliding_window + 1
        assert a + 2 < first_seen < b - 1  # part of the span lies outside the window, part inside
        outside = got[step, : first_seen - a]
        assert torch.all(outside == 0), outside
        assert got[step, first_seen - a:].max() == 1.0
