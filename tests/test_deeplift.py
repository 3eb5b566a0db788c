"""DeepLIFT: hand-computed multipliers on toys, summation-to-delta on tiny LMs, deeplift-ixg vs Captum."""

from __future__ import annotations

import math

import pytest
import torch
from captum.attr import DeepLift

from conftest import ARCHS, build_tiny
from llmattr import methods
from llmattr.api import prepare
from llmattr.methods.deeplift import deeplift_attributions
from llmattr.methods.gradient import baseline_embeds, score_fn
from llmattr.request import Request
from llmattr.targets import Target

EPS32 = torch.finfo(torch.float32).eps


def silu(v: float) -> float:
    return v / (1 + math.exp(-v))


def dsilu(v: float) -> float:
    s = 1 / (1 + math.exp(-v))
    return s * (1 + v * (1 - s))


def test_rescale_rule_on_a_silu_mlp_by_hand():
    """f(x) = w2 . silu(W1 x + b1), x = (1, 1), x0 = 0. Hidden deltas: h = (3, 0.5), h0 = (0, 0.5);
    unit 1 gets the secant silu(3)/3, unit 2 (no delta) the derivative silu'(0.5)."""
    w1, b1, w2 = torch.tensor([[1.0, 2.0], [-1.0, 1.0]]), torch.tensor([0.0, 0.5]), torch.tensor([1.0, -2.0])
    f = lambda x: (torch.nn.functional.silu(x @ w1.T + b1) * w2).sum(-1, keepdim=True)  # noqa: E731
    x = torch.tensor([[1.0, 1.0]])
    attr, delta = deeplift_attributions(f, x, torch.zeros_like(x))
    m1, m2 = silu(3.0) / 3.0, dsilu(0.5)
    multipliers = [1.0 * m1 * 1.0 + (-2.0) * m2 * (-1.0), 1.0 * m1 * 2.0 + (-2.0) * m2 * 1.0]
    assert torch.allclose(attr[0], torch.tensor(multipliers), rtol=1e-6)
    assert math.isclose(float(delta[0]), silu(3.0) - 0.0 + (-2.0) * (silu(0.5) - silu(0.5)), rel_tol=1e-6)
    assert math.isclose(float(attr.sum()), float(delta[0]), rel_tol=1e-6)


def test_product_of_two_input_dependent_factors_uses_the_mean_operands():
    """f = silu(x1) * x2 (a SwiGLU gate), x = (2, 3), x0 = (1, -1): a = silu(x1), b = x2;
    attribution to x1 = (b + b0)/2 * secant(silu) * dx1, to x2 = (a + a0)/2 * dx2."""
    f = lambda x: (torch.nn.functional.silu(x[..., 0]) * x[..., 1])[:, None]  # noqa: E731
    x, x0 = torch.tensor([[2.0, 3.0]]), torch.tensor([[1.0, -1.0]])
    attr, delta = deeplift_attributions(f, x, x0)
    secant = (silu(2.0) - silu(1.0)) / 1.0
    expected = [(3.0 + -1.0) / 2 * secant * 1.0, (silu(2.0) + silu(1.0)) / 2 * 4.0]
    assert torch.allclose(attr[0], torch.tensor(expected), rtol=1e-6)
    assert math.isclose(float(attr.sum()), silu(2.0) * 3.0 - silu(1.0) * -1.0, rel_tol=1e-6)
    assert math.isclose(float(delta[0]), float(attr.sum()), rel_tol=1e-6)


def test_rms_scaling_from_a_zero_reference_gives_the_input_scale():
    """y = x * rsqrt(mean(x^2) + eps), x0 = 0: x's multiplier is the input's scale r (never the reference's
    rsqrt(eps) = 1000), the scale's delta is credited at x0 = 0, so attribution_i = w_i x_i r."""
    eps, w = 1e-6, torch.tensor([0.5, -1.0, 2.0])

    def f(x):
        return (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w).sum(-1, keepdim=True)

    x = torch.tensor([[1.0, 2.0, -2.0]])
    attr, delta = deeplift_attributions(f, x, torch.zeros_like(x))
    r = 1 / math.sqrt(3.0 + eps)
    assert torch.allclose(attr[0], w * x[0] * r, rtol=1e-6)
    assert math.isclose(float(attr.sum()), float(delta[0]), rel_tol=1e-6)


def test_softmax_and_layer_norm_sum_to_delta():
    torch.manual_seed(0)
    w = torch.randn(4, 5)
    ln = torch.nn.LayerNorm(5)

    def f(x):
        z = ln(x + x.roll(1, -1) ** 3)
        return torch.softmax(z @ w.T, dim=-1)[..., :2] * torch.tensor([1.0, -3.0])

    x, x0 = torch.randn(1, 5), torch.randn(1, 5)
    attr, delta = deeplift_attributions(lambda e: f(e), x, x0)
    assert torch.allclose(attr.sum(-1), delta, rtol=1e-4, atol=1e-6)
    grads = torch.autograd.functional.jacobian(lambda e: f(e)[0], x)[:, 0]  # (2, 5)
    assert not torch.allclose(attr, (x - x0) * grads, rtol=1e-3)  # not gradient x delta


@pytest.mark.parametrize("kind", ["probability", "logit"])
def test_summation_to_delta_on_tiny_lms(tiny_lm, kind):
    tgt = prepare(tiny_lm, "A terrific film.", Request("sentiment", answer=" movie was"))
    f, x = score_fn(tiny_lm, tgt, kind), tiny_lm.embed(tgt.input_ids).detach()
    for baseline in ("all", "span", "unk"):
        attr, delta = deeplift_attributions(f, x, baseline_embeds(tiny_lm, x, tgt, baseline))
        with torch.no_grad():
            fx, fx0 = f(x)[0], f(baseline_embeds(tiny_lm, x, tgt, baseline))[0]
        assert torch.allclose(delta, fx - fx0, rtol=1e-5, atol=1e-7)
        gap = (attr.sum((1, 2)) - delta).abs().max()  # float32 secants of near-equal passes: ~1e-5 |F|
        assert gap <= 1e-4 * torch.maximum(fx.abs(), fx0.abs()).max() + 1e-7, (baseline, gap, delta)


def sharpened(arch: str, tokenizer, dtype=torch.float32, gain: float = 20.0):
    """A tiny model whose query projections are scaled by ``gain``: attention scores spread over tens of
    units, so in many softmax rows one pass's scores lie far below the shared shift (the other pass's
    maximum) and its normaliser ``sum exp(z - c)`` is tiny."""
    lm = build_tiny(arch, tokenizer)
    with torch.no_grad():
        for name, weight in lm.model.named_parameters():
            if "q_proj" in name or "c_attn" in name:
                weight.mul_(gain)
    lm.model.to(dtype)
    return lm


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("baseline", ["unk", "all"])
def test_summation_to_delta_under_sharp_attention_matches_float64(tiny_tokenizer, arch, baseline):
    """|convergence delta| / |F(x) - F(x0)| <= 1e-3, and the float32 attributions equal the same rules run
    in float64 to float32 precision (relative to sum |attributions|, ~10^3 float32 epsilons for two layers).

    Anchoring the scale product on one pass for every row (the input's ``1 / sum e``) gave GPT-2 multipliers
    of order 1 / sum e where the reference dominated: exact in float64, but terms ~10^5 |delta| that cancel,
    so float32 missed the delta by 4% (unk) and 15x (zero) on any CPU. Each row anchored on the pass with the
    larger normaliser keeps every coefficient <= 1: no cancellation, whatever the CPU's summation order."""
    runs = []
    for dtype in (torch.float32, torch.float64):
        lm = sharpened(arch, tokenizer=tiny_tokenizer, dtype=dtype)
        tgt = prepare(lm, "A terrific film.", Request("sentiment", answer=" movie was"))
        x = lm.embed(tgt.input_ids).detach().to(dtype)
        runs.append(deeplift_attributions(score_fn(lm, tgt, "logit"), x, baseline_embeds(lm, x, tgt, baseline)))
    (a32, d32), (a64, d64) = [(a.double(), d.double()) for a, d in runs]
    assert ((a32.sum((1, 2)) - d32).abs() <= 1e-3 * d32.abs()).all()
    assert ((a32 - a64).abs().sum((1, 2)) <= 1e3 * EPS32 * a64.abs().sum((1, 2))).all()


def test_deeplift_method_shares_one_forward_across_steps(tiny_llama):
    tgt = prepare(tiny_llama, "A terrific film.", Request("sentiment", answer=" movie was"))
    dl = methods.get("deeplift")
    all_steps = dl.attribute(tiny_llama, tgt)
    for t in range(tgt.n_steps):
        one = Target(tgt.prompt, tgt.target_ids[: t + 1], forced=True)
        assert torch.allclose(all_steps[t], dl.attribute(tiny_llama, one)[-1], rtol=1e-4, atol=1e-9)


def test_deeplift_ixg_matches_captum_deeplift(tiny_llama):
    """Captum's DeepLift has no rule for the Llama non-linearities: its output is (x - x0) * gradient."""
    tgt = prepare(tiny_llama, "A terrific film.", Request("sentiment", answer=" movie"))
    f, x = score_fn(tiny_llama, tgt, "probability"), tiny_llama.embed(tgt.input_ids).detach()

    class Wrapped(torch.nn.Module):
        def __init__(self, lm, t):
            super().__init__()
            self.lm, self.t = lm.model, t

        def forward(self, e):
            return f(e)[:, self.t]

    ours = methods.get("deeplift-ixg").attribute(tiny_llama, tgt)
    real = methods.get("deeplift").attribute(tiny_llama, tgt)
    a, b = tgt.span
    for t in range(tgt.n_steps):
        ref = DeepLift(Wrapped(tiny_llama, t)).attribute(x, baselines=torch.zeros_like(x))
        assert torch.allclose(ours[t], ref[0, a:b].sum(-1), rtol=1e-4, atol=1e-9)
    assert not torch.allclose(ours, real, rtol=1e-2)


@pytest.mark.slow
def test_summation_gap_on_the_real_model(smollm):
    """deeplift sums to F(x) - F(0); deeplift-ixg (the papers' DeepLIFT) does not."""
    tgt = prepare(smollm, "An engrossing film that is never boring.", Request("sentiment"))
    f, x = score_fn(smollm, tgt, "logit"), smollm.embed(tgt.input_ids).detach()
    attr, delta = deeplift_attributions(f, x, torch.zeros_like(x))
    assert torch.allclose(attr.sum((1, 2)), delta, rtol=1e-3)
    _, grads = methods.get("deeplift-ixg", objective="logit").gradients(smollm, tgt)
    ixg_sum = (x * grads[:, 0]).sum((1, 2))
    assert (ixg_sum - delta).abs().max() > 0.1 * delta.abs().max()
