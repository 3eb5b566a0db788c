"""Saliency, Input x Gradient, IG, IGCG, AIEG and GradientSHAP: formulas, Captum agreement, batching."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from captum.attr import GradientShap, InputXGradient, IntegratedGradients, Saliency

from llmattr import methods
from llmattr.api import prepare
from llmattr.errors import LlmattrError
from llmattr.methods import integrated
from llmattr.methods.gradient import baseline_embeds, embedding_gradients, reduce_tokens, score_fn
from llmattr.methods.integrated import (
    emphasis_factor,
    endpoints_and_net_attention,
    integrate,
    path_alphas,
    pos_norm,
)
from llmattr.models import forward
from llmattr.models.forward import prefix_key_values
from llmattr.models.memory import prefix_cache_pays
from llmattr.models.probe import Probe, eager_attention
from llmattr.request import Request
from llmattr.targets import Target
from llmattr.tasks import get_task

MINE = ("saliency", "input-x-gradient", "integrated-gradients", "igcg", "aieg", "gradient-shap",
        "deeplift", "deeplift-ixg")
RTOL, ATOL = 1e-4, 1e-9


@pytest.fixture
def gen_target(tiny_llama):
    """A multi-step forced generation after a sentiment prompt (the tiny model's greedy output is arbitrary)."""
    return prepare(tiny_llama, "A terrific film.", Request("sentiment", answer=" movie was"))


def per_step(f, t):
    """Captum sees one scalar per row: step ``t`` of our embedding-level function."""
    return lambda e: f(e)[:, t]


def test_path_points_are_captums():
    """Our path points and weights equal Captum's own (read from its private module here, in the test only)."""
    from captum.attr._utils.approximation_methods import SUPPORTED_METHODS, approximation_parameters

    from llmattr.methods.integrated import PATH_METHODS

    assert set(PATH_METHODS) == set(SUPPORTED_METHODS)
    for method in PATH_METHODS:
        step_sizes, alphas = approximation_parameters(method)
        for n in (2, 5, 16):
            got = path_alphas(method, n)
            assert torch.equal(got[0], torch.tensor(alphas(n), dtype=torch.float64)), (method, n)
            assert torch.equal(got[1], torch.tensor(step_sizes(n), dtype=torch.float64)), (method, n)


def test_reduce_tokens_by_hand():
    attr = torch.tensor([[3.0, -4.0], [1.0, 1.0]])
    assert torch.equal(reduce_tokens(attr, "l2"), torch.tensor([5.0, math.sqrt(2)]))
    assert torch.equal(reduce_tokens(attr, "sum"), torch.tensor([-1.0, 2.0]))
    assert torch.equal(reduce_tokens(attr, "l1"), torch.tensor([7.0, 2.0]))
    with pytest.raises(LlmattrError):
        reduce_tokens(attr, "max")


def test_probability_target_is_softmax_of_logits(tiny_llama, gen_target):
    x = tiny_llama.embed(gen_target.input_ids)
    prob = score_fn(tiny_llama, gen_target, "probability")(x)
    logits = tiny_llama.model(inputs_embeds=x).logits[0, gen_target.positions].softmax(-1)
    assert torch.allclose(prob[0], logits[torch.arange(gen_target.n_steps), gen_target.target_ids], rtol=1e-5)


@pytest.mark.parametrize("kind", ["probability", "logit"])
def test_saliency_and_ixg_match_captum(tiny_llama, gen_target, kind):
    lm, tgt = tiny_llama, gen_target
    f, x = score_fn(lm, tgt, kind), lm.embed(tgt.input_ids).detach()
    a, b = tgt.span
    sal = methods.get("saliency", target=kind).attribute(lm, tgt)
    ixg = methods.get("input-x-gradient", target=kind).attribute(lm, tgt)
    for t in range(tgt.n_steps):
        ref_sal = Saliency(per_step(f, t)).attribute(x, abs=False)[0]
        ref_ixg = InputXGradient(per_step(f, t)).attribute(x)[0]
        assert torch.allclose(sal[t], ref_sal[a:b].norm(dim=-1), rtol=RTOL, atol=ATOL)
        assert torch.allclose(ixg[t], ref_ixg[a:b].sum(-1), rtol=RTOL, atol=ATOL)


def test_unk_baseline_is_inseqs(tiny_llama, gen_target):
    """baseline='unk': the unk token's embedding everywhere except at end-of-sequence tokens (Inseq's)."""
    lm, tgt = tiny_llama, gen_target
    ids = tgt.input_ids[0]
    x0 = baseline_embeds(lm, lm.embed(tgt.input_ids), tgt, "unk")[0]
    eos = ids == lm.tokenizer.eos_token_id
    assert eos.any() and (~eos).any()
    unk = lm.model.get_input_embeddings().weight[lm.tokenizer.unk_token_id]
    assert torch.equal(x0[~eos], unk.expand(int((~eos).sum()), -1))
    assert torch.equal(x0[eos], lm.embed(ids[eos]))


@pytest.mark.parametrize("baseline", ["all", "span", "unk"])
def test_integrated_gradients_match_captum(tiny_llama, gen_target, baseline):
    lm, tgt = tiny_llama, gen_target
    ig = methods.get("integrated-gradients", baseline=baseline, internal_batch_size=5)
    attr = ig.attributions(lm, tgt)  # (T, S, D), chunked 5 + 5 + 5 + 1
    f, x = score_fn(lm, tgt, "probability"), lm.embed(tgt.input_ids).detach()
    x0 = baseline_embeds(lm, x, tgt, baseline)
    for t in range(tgt.n_steps):
        ref = IntegratedGradients(per_step(f, t)).attribute(x, baselines=x0, n_steps=16,
                                                            method="gausslegendre", internal_batch_size=8)
        assert torch.allclose(attr[t], ref[0], rtol=RTOL, atol=ATOL)
    a, b = tgt.span
    assert torch.allclose(ig.attribute(lm, tgt), attr[:, a:b].sum(-1), rtol=RTOL, atol=ATOL)
    if baseline == "span":  # nothing outside the span moves, so nothing outside it is attributed
        assert attr[:, :a].abs().max() == 0


@pytest.mark.parametrize("kind", ["probability", "logit"])
def test_ig_completeness_at_128_steps(tiny_llama, gen_target, kind):
    ig = methods.get("integrated-gradients", n_steps=128, internal_batch_size=64, target=kind)
    attr = ig.attributions(tiny_llama, gen_target)
    f, x = score_fn(tiny_llama, gen_target, kind), tiny_llama.embed(gen_target.input_ids)
    delta = (f(x) - f(torch.zeros_like(x)))[0]
    assert torch.allclose(attr.sum((1, 2)), delta, rtol=0.02)


def test_gradient_shap_matches_captum(tiny_llama, gen_target):
    lm, tgt = tiny_llama, gen_target
    f, x = score_fn(lm, tgt, "probability"), lm.embed(tgt.input_ids).detach()
    np.random.seed(7)
    np.random.choice(1, 5)  # Captum draws the baseline index, then the alphas
    alphas = torch.tensor(np.random.uniform(0.0, 1.0, 5))
    ours = x * integrate(f, x, torch.zeros_like(x), alphas, torch.full((5,), 0.2), batch_size=16)[0]
    for t in range(tgt.n_steps):
        np.random.seed(7)
        ref = GradientShap(per_step(f, t)).attribute(x, baselines=torch.zeros_like(x), n_samples=5, stdevs=0.0)
        assert torch.allclose(ours[t], ref[0], rtol=RTOL, atol=ATOL)


def test_gradient_shap_is_seeded():
    a, _ = methods.get("gradient-shap", seed=3).path()
    b, _ = methods.get("gradient-shap", seed=3).path()
    c, _ = methods.get("gradient-shap", seed=4).path()
    assert torch.equal(a, b) and not torch.equal(a, c) and ((a > 0) & (a < 1)).all()


def test_igcg_clips_each_path_gradient(tiny_llama, gen_target):
    lm, tgt = tiny_llama, gen_target
    f, x = score_fn(lm, tgt, "probability"), lm.embed(tgt.input_ids).detach()
    alphas, weights = path_alphas("gausslegendre", 4)
    grads = torch.stack([embedding_gradients(f, a.float() * x)[1][:, 0] for a in alphas], 1)  # (T, N, S, D)
    theta = float(grads.abs().amax() / 10)
    by_hand = x[0] * torch.einsum("n,tnsd->tsd", weights.float().to(x.device), grads.clamp(-theta, theta))
    a, b = tgt.span
    igcg = methods.get("igcg", n_steps=4, threshold=theta).attribute(lm, tgt)
    assert torch.allclose(igcg, by_hand[:, a:b].sum(-1), rtol=RTOL, atol=ATOL)
    plain = methods.get("integrated-gradients", n_steps=4).attribute(lm, tgt)
    assert not torch.allclose(igcg, plain)
    assert torch.allclose(methods.get("igcg", n_steps=4).attribute(lm, tgt), plain)  # 1e6 never bites


def test_emphasis_factor_and_pos_norm_by_hand():
    ef = emphasis_factor(torch.tensor([0.5, 0.2, 0.0, -1.0]), torch.tensor([0.5, 0.6, 0.0, 1.0]))
    assert torch.allclose(ef, torch.tensor([0.0, 0.5, 0.0, 1.0]))
    assert torch.allclose(pos_norm(torch.tensor([[2.0, -1.0, 6.0], [-1.0, 0.0, -2.0]])),
                          torch.tensor([[0.25, 0.0, 0.75], [0.0, 0.0, 0.0]]))


def test_aieg_emphasis_zero_where_f_is_flat():
    """F(e) = sum(e[:, 0]) - sum(e[:, 1]) with equal sums: F is 0 along the whole path, its gradient is
    not. Plain IG attributes +-x per token; AIEG's EF is 0 at every step, so its integral vanishes."""
    x = torch.tensor([[[1.0, 3.0], [2.0, 0.0]]])  # sums 3 and 3
    f = lambda e: (e[..., 0].sum(-1) - e[..., 1].sum(-1))[:, None]  # noqa: E731
    alphas, weights = methods.get("aieg", n_steps=8).path()
    x0 = torch.zeros_like(x)
    plain = integrate(f, x, x0, alphas, weights, batch_size=3)[0]
    emph = integrate(f, x, x0, alphas, weights, batch_size=3, f_start=f(x0))[0]
    assert plain.abs().sum() > 0 and emph.abs().sum() == 0


def test_aieg_emphasis_one_everywhere_is_plain_riemann_ig():
    """F(e) = cos(N pi (w.e)/(w.x)): on the path F(alpha_k) = cos(k pi) = +-1 alternates, so EF = 1."""
    n = 8
    x, w = torch.tensor([[[0.3, -0.2], [0.5, 0.4]]]), torch.tensor([[1.0, 2.0], [-0.5, 3.0]])
    f = lambda e: torch.cos(n * math.pi * (e * w).sum((1, 2)) / (x * w).sum())[:, None]  # noqa: E731
    alphas, weights = methods.get("aieg", n_steps=n).path()
    x0 = torch.zeros_like(x)
    plain = integrate(f, x, x0, alphas, weights, batch_size=3)[0]
    emph = integrate(f, x, x0, alphas, weights, batch_size=3, f_start=f(x0))[0]
    assert torch.allclose(plain, emph, rtol=1e-5)


def test_aieg_is_posnorm_ig_times_net_attention_when_ef_is_one(tiny_llama, gen_target, monkeypatch):
    lm, tgt = tiny_llama, gen_target
    monkeypatch.setattr(integrated, "emphasis_factor", lambda now, prev: torch.ones_like(now))
    aieg = methods.get("aieg", n_steps=6, internal_batch_size=4).attribute(lm, tgt)
    ig = methods.get("integrated-gradients", n_steps=6, method="riemann_right").attributions(lm, tgt)
    x = lm.embed(tgt.input_ids)
    with torch.no_grad(), eager_attention():
        att = lm.model(inputs_embeds=x, output_attentions=True).attentions  # L x (1, H, S, S)
    net = torch.stack(att)[:, 0][:, :, tgt.positions].mean((0, 1))  # (T, S)
    a, b = tgt.span
    expected = pos_norm(ig.sum(-1)) * net
    assert torch.allclose(aieg, expected[:, a:b], rtol=RTOL, atol=ATOL)
    f, x, x0 = methods.get("aieg").inputs(lm, tgt)
    f_start, f_end, got = endpoints_and_net_attention(f, x, x0, tgt.positions)
    assert torch.allclose(got, net, rtol=1e-5)
    with torch.no_grad():  # the two endpoints of the one two-row forward are F(x0) and F(x)
        assert torch.allclose(f_start, f(x0), rtol=1e-5) and torch.allclose(f_end, f(x), rtol=1e-5)


def test_aieg_scores_are_nonnegative_and_sum_below_one(tiny_llama, gen_target):
    raw = methods.get("aieg", n_steps=4).attribute(tiny_llama, gen_target)
    assert (raw >= 0).all() and (raw.sum(-1) <= 1).all()


@pytest.mark.parametrize("name", ["saliency", "input-x-gradient", "integrated-gradients", "aieg", "gradient-shap"])
def test_shared_forward_equals_one_step_at_a_time(tiny_llama, gen_target, name):
    """Batched vector-Jacobian products give each step the gradient of its own forward."""
    method = methods.get(name, **({"n_steps": 4} if name in ("integrated-gradients", "aieg") else {}))
    all_steps = method.attribute(tiny_llama, gen_target)
    for t in range(gen_target.n_steps):
        one = Target(gen_target.prompt, gen_target.target_ids[: t + 1], forced=True)
        assert torch.allclose(all_steps[t], method.attribute(tiny_llama, one)[-1], rtol=RTOL, atol=1e-8)


@pytest.mark.parametrize("name", MINE)
def test_every_method_runs_on_every_architecture(tiny_lm, tiny_tokenizer, name):
    tgt = prepare(tiny_lm, "The movie was dull.", Request("sentiment", max_new_tokens=2))
    params = {"n_steps": 4} if name in ("integrated-gradients", "igcg", "aieg") else {}
    raw = methods.get(name, **params).attribute(tiny_lm, tgt)
    assert raw.shape == (tgt.n_steps, tgt.span[1] - tgt.span[0])
    assert torch.isfinite(raw).all() and raw.dtype == torch.float32


@pytest.mark.parametrize("name,params", [
    ("saliency", {"reduction": "max"}), ("input-x-gradient", {"objective": "loss"}),
    ("integrated-gradients", {"n_steps": 0}), ("integrated-gradients", {"method": "simpson"}),
    ("integrated-gradients", {"baseline": "uniform"}), ("igcg", {"threshold": -1}),
    ("gradient-shap", {"n_samples": 0}), ("aieg", {"reduction": "sum"}), ("deeplift", {"n_steps": 4}),
])
def test_bad_parameters_raise_one_line_errors(name, params):
    with pytest.raises(LlmattrError):
        methods.get(name, **params)


def test_registry_lists_the_gradient_family():
    assert set(MINE) <= set(methods.available())
    for name in MINE:
        cls = methods.REGISTRY[name]
        assert cls.needs_gradients and cls.summary and cls.cost


@pytest.mark.slow
def test_every_gradient_method_on_the_real_model(smollm):
    sentiment = prepare(smollm, "An engrossing film that is never boring.", Request("sentiment"))
    story = prepare(smollm, "Why did the cat sit by the door?", Request("generate", max_new_tokens=10))
    for tgt in (sentiment, story):
        for name in MINE:
            params = {"n_steps": 2} if name in ("integrated-gradients", "igcg", "aieg") else {}
            params = {"n_samples": 2} if name == "gradient-shap" else params
            raw = methods.get(name, **params).attribute(smollm, tgt)
            assert raw.shape == (tgt.n_steps, tgt.span[1] - tgt.span[0]) and torch.isfinite(raw).all(), name


def test_cached_prefix_leaves_span_gradients_unchanged(tiny_lm):
    """score_fn(prefix=span start): same F and span gradients as the full pass, on every architecture."""
    tgt = prepare(tiny_lm, "A terrific film.", Request("sentiment", answer=" movie was"))
    x = tiny_lm.embed(tgt.input_ids).detach()
    rows = torch.stack([x[0], 0.5 * x[0]])  # two path points, as IG feeds them
    a = tgt.span[0]
    assert prefix_cache_pays(tiny_lm, a, int(tgt.input_ids.shape[1]))  # short: the cached path
    full_f, full_g = embedding_gradients(score_fn(tiny_lm, tgt, "probability"), rows)
    fast_f, fast_g = embedding_gradients(score_fn(tiny_lm, tgt, "probability", prefix=a), rows)
    torch.testing.assert_close(fast_f, full_f, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(fast_g[:, :, a:], full_g[:, :, a:], rtol=1e-4, atol=1e-7)
    assert torch.all(fast_g[:, :, :a] == 0) and bool(full_g[:, :, a:].abs().sum() > 0)


def test_template_cache_is_computed_once_per_task_and_kept_within_its_budget(tiny_llama, monkeypatch):
    """Two examples of one task share the template's keys and values: the second runs no template forward and its
    scores equal a run without the kept cache; a probe bypasses it; the budget evicts the least recently used."""
    lm, task = tiny_llama, get_task("sentiment")
    first, second = (prepare(lm, text, Request(task, answer="Positive")) for text in ("A dull film.", "A fine, warm "
                                                                                       "film."))
    assert first.span[0] == second.span[0] > 0 and prefix_cache_pays(lm, first.span[0], first.input_ids.shape[1])
    runs = []
    monkeypatch.setattr(forward, "prefix_key_values",
                        lambda *a: runs.append(1) or prefix_key_values(*a))
    saliency = methods.get("saliency")
    want = [saliency.attribute(lm, t) for t in (first, second)]
    assert len(runs) == 1 and len(lm.kept) == 1
    for target, expected in zip((second, first), want[::-1], strict=True):
        lm.forget()
        torch.testing.assert_close(saliency.attribute(lm, target), expected, rtol=0, atol=0)
    with Probe(record=("q",)):
        saliency.attribute(lm, first)
    assert len(runs) == 4 and len(lm.kept) == 1  # the probe's run neither used nor kept one
    other = prepare(lm, {"text": "A dull film."}, Request("generate", answer="Yes"))
    saliency.attribute(lm, other)
    assert len(lm.kept) == 2
    lm.forget()
    lm.kept.budget = 1
    saliency.attribute(lm, first)
    assert not len(lm.kept)  # over the budget: nothing kept
