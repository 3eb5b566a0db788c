"""Soft-NC/NS and pi-Soft-NC/NS (paper 000 eqs. 1-7): formulas, alpha search, Monte Carlo, seeds, modes."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from conftest import build_tiny
from llmattr.errors import LlmattrError
from llmattr.explanation import Explanation
from llmattr.faithfulness import evaluate, target_from_explanation
from llmattr.faithfulness.engine import PerturbationEngine
from llmattr.faithfulness.soft import (
    PI_GRID,
    StepSamples,
    alpha_search,
    auc,
    check_pis,
    draw_masks,
    evaluate_target,
    hellinger,
    mc_errors,
    mc_seed,
    reachable,
    reagent_distance,
    soft_samples,
    transform,
)
from llmattr.prompting import build_prompt
from llmattr.targets import Target
from llmattr.tasks import get_task

TEXT = "the quick brown fox jumps"


# ---------------------------------------------------------------------------------------- helpers
def sentiment_target(lm, text: str = TEXT, answer: str = " Positive", steps: int = 1) -> Target:
    prompt = build_prompt(lm.tokenizer, get_task("sentiment"), {"text": text})
    ids = lm.tokenizer(answer, add_special_tokens=False)["input_ids"][:steps]
    return Target(prompt=prompt, target_ids=torch.tensor(ids), forced=True)


def explanation_for(lm, target: Target, scores: torch.Tensor, task: str = "sentiment",
                    method: str = "toy") -> Explanation:
    """An Explanation holding ``scores`` (n_steps, m) as its retain probabilities."""
    ids = target.prompt.input_ids[0].tolist()
    steps = target.target_ids.tolist()
    return Explanation.from_raw(
        scores, False, step_tokens=[lm.tokenizer.decode([i]) for i in steps], step_ids=steps,
        positions=target.positions.tolist(), model=lm.model_id, method=method, params={},
        tokens=[lm.tokenizer.decode([i]) for i in ids], token_ids=ids, span=target.span, task=task,
        text=target.prompt.text, offsets=target.prompt.offsets,
    )


def unique_content_positions(target: Target) -> list[int]:
    """Span-relative indices of content tokens whose id occurs once in the whole input."""
    ids = target.input_ids[0].tolist()
    a, b = target.span
    return [i - a for i in range(a, b) if ids.count(ids[i]) == 1]


@torch.no_grad()
def toy_model(tokenizer, vectors: dict[int, torch.Tensor], seed: int = 0):
    """One-layer Llama whose output depends only on the tokens in ``vectors`` (id -> 32-d embedding).

    Every other embedding is zero; q = k = 0 gives uniform causal attention; v and o pass dims 0-15
    through; the MLP is off. So the last hidden state is the mean over positions of the RMS-normalised
    embeddings of the chosen tokens, and the next-token distribution is uniform when they are all zeroed.
    The LM head ignores dim 15 (a direction that changes the norm but not the logits).
    """
    lm = build_tiny("llama", tokenizer, seed=seed, num_hidden_layers=1, tie_word_embeddings=False)
    model = lm.model
    for param in model.parameters():
        param.zero_()
    for norm in (model.model.norm, model.model.layers[0].input_layernorm,
                 model.model.layers[0].post_attention_layernorm):
        norm.weight.fill_(1.0)
    for token_id, vector in vectors.items():
        model.model.embed_tokens.weight[token_id] = vector
    attn = model.model.layers[0].self_attn
    attn.v_proj.weight[:16, :16] = torch.eye(16)
    attn.o_proj.weight[0:8, 0:8] = torch.eye(8)  # head 0 <- kv head 0 (v dims 0-7)
    attn.o_proj.weight[8:16, 16:24] = torch.eye(8)  # head 2 <- kv head 1 (v dims 8-15)
    gen = torch.Generator().manual_seed(seed)
    model.lm_head.weight.copy_(torch.randn(model.lm_head.weight.shape, generator=gen) * 3)
    model.lm_head.weight[:, 15:] = 0
    return lm


def single_token_toy(tokenizer):
    """The toy model driven by one content token j; returns (lm, target, j)."""
    probe = build_tiny("llama", tokenizer, num_hidden_layers=1)
    target = sentiment_target(probe)
    j = unique_content_positions(target)[1]
    token_id = int(target.input_ids[0, target.span[0] + j])
    vector = torch.zeros(32)
    vector[:15] = torch.randn(15, generator=torch.Generator().manual_seed(3))
    return toy_model(tokenizer, {token_id: vector}), target, j


# ---------------------------------------------------------------------------------------- distances
def test_hellinger_by_hand():
    p = torch.tensor([0.5, 0.5, 0.0])
    q = torch.tensor([1.0, 0.0, 0.0])
    by_hand = math.sqrt((math.sqrt(0.5) - 1) ** 2 + 0.5) / math.sqrt(2)  # 0.5411961
    assert hellinger(p, q).item() == pytest.approx(by_hand, abs=1e-7)
    assert hellinger(p, q).item() == pytest.approx(0.5411961, abs=1e-7)
    assert reagent_distance(p, q).item() == pytest.approx(((math.sqrt(0.5) - 1) ** 2 + 0.5) / math.sqrt(2))
    assert hellinger(q, q).item() == 0
    assert hellinger(q, torch.tensor([0.0, 1.0, 0.0])).item() == pytest.approx(1.0)  # disjoint supports


# ---------------------------------------------------------------------------------------- alpha search
ADVERSARIAL = [
    torch.tensor([0.0, 1.0]), torch.tensor([0.0, 0.0, 1.0]), torch.tensor([1.0, 1.0, 1.0]),
    torch.tensor([0.0, 0.0, 0.0]), torch.tensor([0.5] * 7), torch.tensor([0.3]), torch.tensor([1.0]),
    torch.tensor([0.0]), torch.tensor([1e-9, 1 - 1e-9, 0.5]), torch.tensor([1.0] * 99 + [0.0]),
]


def with_limits(m: int, seed: int) -> torch.Tensor:
    """Random retain probabilities with exact 0s, exact 1s and ties (min-max always makes one 0 and one 1)."""
    g = torch.Generator().manual_seed(seed)
    s = torch.rand(m, generator=g, dtype=torch.float64)
    kind = torch.randint(0, 5, (m,), generator=g)
    s = torch.where(kind == 0, 0.0, torch.where(kind == 1, 1.0, torch.where(kind == 2, 0.25, s)))
    if m > 1:
        s[:2] = torch.tensor([0.0, 1.0], dtype=torch.float64)
    return s


RANDOM = [with_limits(m, seed) for m in (1, 2, 5, 40, 1000) for seed in range(3)]


@pytest.mark.parametrize("s", ADVERSARIAL + RANDOM + [torch.rand(m, generator=torch.Generator().manual_seed(m))
                                                      for m in (1, 2, 5, 40, 300)])
def test_transform_hits_every_pi(s):
    """mean(s~) = pi within the search tolerance for every pi of the grid, in both fill regimes too; s~ in [0, 1]."""
    pis = check_pis(None)
    s_tilde = transform(s, pis)
    assert (s_tilde.mean(-1) - pis).abs().max() <= 1e-4
    assert ((s_tilde >= 0) & (s_tilde <= 1)).all()
    alpha = alpha_search(s, pis)
    lower, upper = reachable(s.double())
    inside = (pis > lower) & (pis < upper)
    assert (alpha[inside] >= 0).all() and alpha[~inside].isnan().all()
    torch.testing.assert_close(s_tilde[inside], s.double()[None] ** alpha[inside, None], rtol=0, atol=0)


@pytest.mark.parametrize("s", RANDOM + [torch.tensor([0.0, 1.0]), torch.tensor([0.3]), torch.tensor([0.0]),
                                        torch.tensor([1.0]), torch.tensor([0.0, 0.5, 0.5, 1.0])])
@pytest.mark.parametrize("c", [0.25, 0.5, 2.0, 4.0])
def test_transform_is_invariant_to_powers_of_the_scores(s, c):
    """Paper 000's promise, exactly: s and s**c give the same s~ (alpha -> alpha / c), so the same coupled masks."""
    pis = check_pis(None)
    s = s.double()
    same, powered = transform(s, pis), transform(s**c, pis)
    assert (same - powered).abs().max() <= 1e-12
    masks = [draw_masks(t, 15, torch.Generator().manual_seed(7)) for t in (same, powered)]
    assert all(torch.equal(masks[0][f], masks[1][f]) for f in ("ns", "nc"))
    lower, upper = reachable(s)
    inside = (pis > lower) & (pis < upper)
    torch.testing.assert_close(alpha_search(s**c, pis)[inside] * c, alpha_search(s, pis)[inside], rtol=1e-12, atol=0)


def test_transform_fills_beyond_the_limits_by_hand():
    """s = (0, 0, 0.5, 1): limits o/m = 0.25 and (m - z)/m = 0.5. Above 0.5 the two zeros share the rest,
    q = (pi m - 2) / 2; below 0.25 the one-token alone keeps pi m; between, 0.25 + 0.5**alpha / 4 = pi."""
    s = torch.tensor([0.0, 0.0, 0.5, 1.0], dtype=torch.float64)
    pis = torch.tensor([0.1, 0.25, 0.375, 0.5, 0.75, 0.95], dtype=torch.float64)
    got = transform(s, pis, tol=1e-13)
    expected = torch.tensor([[0, 0, 0, 0.4], [0, 0, 0, 1], [0, 0, 0.5, 1], [0, 0, 1, 1], [0.5, 0.5, 1, 1],
                             [0.9, 0.9, 1, 1]], dtype=torch.float64)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-12)
    torch.testing.assert_close(alpha_search(s, pis, tol=1e-13)[2], torch.tensor(1.0, dtype=torch.float64))


@pytest.mark.parametrize("s", RANDOM[3:] + [torch.tensor([0.0, 0.0, 0.5, 1.0])])
def test_transform_is_continuous_in_pi_at_the_limits(s):
    """Each fill meets the limit of s**alpha at its end: pi just inside and at a limit give s~ within O(gap)."""
    s = s.double()
    for limit in reachable(s):
        if not 0 < limit < 1:
            continue
        for gap in (1e-4, 1e-6):
            near = torch.tensor([limit - gap, limit, limit + gap], dtype=torch.float64).clamp(1e-9, 1 - 1e-9)
            rows = transform(s, near, tol=1e-12)
            assert (rows[0] - rows[1]).abs().max() <= 100 * gap * s.numel() ** 0.5 + 1e-9
            assert (rows[2] - rows[1]).abs().max() <= 100 * gap * s.numel() ** 0.5 + 1e-9


@pytest.mark.parametrize("s", RANDOM)
def test_transform_is_monotone_in_s(s):
    """A token with a larger score is never kept with a smaller probability, at every pi."""
    order = s.double().argsort(stable=True)
    s_tilde = transform(s, check_pis(None))[:, order]
    assert (s_tilde.diff(dim=-1) >= -1e-15).all()


def test_alpha_search_length_one_is_analytic():
    s, pis = torch.tensor([0.3]), torch.tensor([0.1, 0.5, 0.9], dtype=torch.float64)
    expected = torch.log(pis) / math.log(0.3)
    torch.testing.assert_close(alpha_search(s, pis), expected, rtol=1e-3, atol=0)


@pytest.mark.parametrize("pis", [[0.0, 0.5], [0.5, 1.0], [1.2], [-0.1], [], [0.5, 0.3], [float("nan")]])
def test_bad_pis(pis):
    with pytest.raises(LlmattrError):
        check_pis(pis)


def test_auc_is_trapezoid_over_grid_span():
    assert auc([0.1, 0.5, 0.9], [0.0, 1.0, 1.0]) == pytest.approx((0.2 + 0.4) / 0.8)
    assert auc(list(PI_GRID), [0.3] * 19) == pytest.approx(0.3)
    assert auc([0.5], [0.7]) == 0.7


# ---------------------------------------------------------------------------------------- toy models
def test_toy_model_depends_only_on_token_j(tiny_tokenizer):
    lm, target, j = single_token_toy(tiny_tokenizer)
    engine = PerturbationEngine(lm, target)
    m = target.span[1] - target.span[0]
    without_j = torch.ones(3, m)
    without_j[:, j] = 0
    without_j[1, (j + 1) % m] = 0
    out = engine.probs(torch.cat([torch.zeros(1, m), without_j, torch.ones(1, m)]))
    uniform = torch.full_like(engine.clean_probs, 1 / engine.clean_probs.numel())
    torch.testing.assert_close(out[:4], uniform.expand(4, -1), atol=1e-6, rtol=0)
    torch.testing.assert_close(out[4], engine.clean_probs, atol=1e-6, rtol=0)
    assert hellinger(engine.clean_probs, uniform) > 0.3


def test_toy_pi_soft_equals_transformed_score_of_j(tiny_tokenizer):
    """Output depends only on j: NS keeps j w.p. s~_j (NS = 1, else 0); NC removes j w.p. s~_j (NC = 1)."""
    lm, target, j = single_token_toy(tiny_tokenizer)
    m = target.span[1] - target.span[0]
    s = torch.linspace(0.1, 0.9, m)[None]
    n = 400
    result = evaluate_target(lm, target, s, [0], samples=n, pis=(0.2, 0.5, 0.8))
    expected = transform(s[0], torch.tensor([0.2, 0.5, 0.8], dtype=torch.float64))[:, j]
    se = (expected * (1 - expected) / n).sqrt()
    for name, values in (("pi_soft_ns", result.pi_soft_ns), ("pi_soft_nc", result.pi_soft_nc)):
        assert ((torch.tensor(values) - expected).abs() <= 4 * se + 1e-9).all()
        # every sample is 0 or 1 (up to float32 rounding of the distances, ~1e-7 relative) with mean v:
        # its standard error is sqrt(v (1 - v) / (n - 1))
        v = torch.tensor(values, dtype=torch.float64)
        torch.testing.assert_close(torch.tensor(result.mc_se[name], dtype=torch.float64),
                                   (v * (1 - v) / (n - 1)).sqrt(), rtol=1e-5, atol=1e-6)
    assert result.expected_retained == pytest.approx(float(s.sum()))


def test_all_mass_on_j_beats_uniform_and_reversed(tiny_tokenizer):
    lm, target, j = single_token_toy(tiny_tokenizer)
    m = target.span[1] - target.span[0]
    onehot = torch.zeros(1, m)
    onehot[0, j] = 1
    candidates = {"all-on-j": onehot, "uniform": torch.full((1, m), 0.5), "reversed": 1 - onehot}
    results = {name: evaluate_target(lm, target, s, [0], samples=15, seed=1, method=name)
               for name, s in candidates.items()}
    for other in ("uniform", "reversed"):
        assert results["all-on-j"].auc_ns > results[other].auc_ns
        assert results["all-on-j"].auc_nc > results[other].auc_nc
    assert results["uniform"].auc_ns > results["reversed"].auc_ns


def test_soft_nc_can_exceed_one(tiny_tokenizer):
    """Removing only token k moves the output further than the zero baseline (paper 000 after eq. 5)."""
    probe = build_tiny("llama", tiny_tokenizer, num_hidden_layers=1)
    target = sentiment_target(probe)
    j, k = unique_content_positions(target)[:2]
    ids = target.input_ids[0]
    a = torch.zeros(32)
    a[:8] = torch.randn(8, generator=torch.Generator().manual_seed(5))
    u = torch.zeros(32)
    u[15] = a.norm()  # same size as a, invisible to the LM head
    lm = toy_model(tiny_tokenizer, {int(ids[target.span[0] + j]): a + u, int(ids[target.span[0] + k]): -a})
    m = target.span[1] - target.span[0]
    s = torch.full((1, m), 0.5)
    s[0, j], s[0, k] = 0.0, 1.0  # NC keeps j and removes k for sure
    result = evaluate_target(lm, target, s, [0], metrics=("soft-nc",), samples=4, pis=(0.5,))
    assert result.soft_nc > 1
    assert result.pi_soft_ns is None and result.soft_ns is None


def test_zero_baseline_without_effect_is_an_error(tiny_tokenizer):
    lm = toy_model(tiny_tokenizer, {})  # nothing carries information: D0 = 0
    target = sentiment_target(lm)
    s = torch.full((1, target.span[1] - target.span[0]), 0.5)
    with pytest.raises(LlmattrError, match="D0 = 0"):
        evaluate_target(lm, target, s, [0], samples=2, pis=(0.5,))


# ---------------------------------------------------------------------------------------- Monte Carlo
def test_monte_carlo_matches_exact_enumeration(tiny_tokenizer):
    """With many samples the estimator agrees with the exact expectation over all 2^m masks (3 s.e.)."""
    lm = build_tiny("llama", tiny_tokenizer, seed=2, initializer_range=0.3)
    target = sentiment_target(lm, text="the lazy dog")
    m = target.span[1] - target.span[0]
    assert m <= 8
    s = torch.linspace(0.15, 0.85, m, dtype=torch.float64)
    s_tilde = torch.cat([transform(s, torch.tensor([0.3], dtype=torch.float64)), s[None]])
    engine = PerturbationEngine(lm, target)
    n = 3000
    mc = soft_samples(engine, s_tilde, n, torch.Generator().manual_seed(0))
    masks = torch.tensor(list(itertools.product([0.0, 1.0], repeat=m)), dtype=torch.float64)
    dist = hellinger(engine.clean_probs.double()[None], engine.probs(masks).double()).cpu()
    ns_value, nc_value = (mc.d0 - dist).clamp_min(0) / mc.d0, dist / mc.d0
    for row, st in enumerate(s_tilde):
        weight_ns = (st ** masks * (1 - st) ** (1 - masks)).prod(-1)  # P(mask) with keep prob s~
        weight_nc = ((1 - st) ** masks * st ** (1 - masks)).prod(-1)  # keep prob 1 - s~
        for samples, exact in ((mc.ns[row], weight_ns @ ns_value), (mc.nc[row], weight_nc @ nc_value)):
            se = samples.std() / math.sqrt(n)
            assert se > 0
            assert abs(samples.mean() - exact) <= 3 * se


def test_mc_errors_combine_samples_steps_and_auc():
    """se of a mean over S samples, sqrt(sum_t se_t^2) / T over steps; the AUC's from per-sample AUCs."""
    gen = torch.Generator().manual_seed(0)
    pis = [0.2, 0.5, 0.9]
    steps = [StepSamples(1.0, torch.rand(4, 6, generator=gen, dtype=torch.float64), None) for _ in range(2)]
    se = mc_errors(steps, pis)
    assert set(se) == {"pi_soft_ns", "soft_ns", "pi_soft_ns_auc"}

    def sem(x):  # over the last axis
        return x.std(-1, correction=1) / math.sqrt(x.shape[-1])

    by_hand = torch.stack([sem(st.ns) for st in steps]).pow(2).sum(0).sqrt() / 2
    torch.testing.assert_close(torch.tensor(se["pi_soft_ns"], dtype=torch.float64), by_hand[:3])
    assert se["soft_ns"] == pytest.approx(float(by_hand[3]))
    w = torch.tensor([0.3 / 2, (0.3 + 0.4) / 2, 0.4 / 2], dtype=torch.float64) / 0.7  # trapezoid weights / span
    auc_se = torch.stack([sem(w @ st.ns[:3]) for st in steps]).pow(2).sum().sqrt() / 2
    assert se["pi_soft_ns_auc"] == pytest.approx(float(auc_se))
    one = mc_errors([StepSamples(1.0, torch.rand(4, 1, dtype=torch.float64), None)], pis)
    assert one["soft_ns"] is None and one["pi_soft_ns"] == [None] * 3


# ---------------------------------------------------------------------------------------- coupling
def test_coupled_masks_have_the_independent_marginals():
    """100k draws: the same keep rates as independent masks (NS draws are even bit-identical under one
    seed), NC = complement of NS, and both within 5 binomial s.e. of s and 1 - s."""
    s = torch.tensor([[0.0, 0.03, 0.25, 0.5, 0.9, 1.0]], dtype=torch.float64)
    n = 100_000
    coupled = draw_masks(s, n, torch.Generator().manual_seed(11), coupling="coupled")
    independent = draw_masks(s, n, torch.Generator().manual_seed(11), coupling="independent")
    assert torch.equal(coupled["ns"], independent["ns"])
    assert torch.equal(coupled["nc"], 1 - coupled["ns"])
    tolerance = 5 * (s * (1 - s) / n).sqrt()[0]
    for masks in (coupled, independent):
        assert ((masks["ns"].mean((0, 1)) - s[0]).abs() <= tolerance).all()
        assert ((masks["nc"].mean((0, 1)) - (1 - s[0])).abs() <= tolerance).all()
    assert not torch.equal(independent["nc"], 1 - independent["ns"])
    only_nc = draw_masks(s, 10, torch.Generator().manual_seed(1), families=("nc",))
    assert set(only_nc) == {"nc"} and torch.equal(only_nc["nc"], 1 - draw_masks(
        s, 10, torch.Generator().manual_seed(1), families=("ns",))["ns"])


def test_coupled_method_compared_with_itself_is_identical(tiny_llama):
    target = sentiment_target(tiny_llama)
    s = torch.rand(1, target.span[1] - target.span[0], generator=torch.Generator().manual_seed(2))
    kwargs = {"samples": 3, "seed": 5, "pis": (0.3, 0.7), "example": "ex"}
    a = evaluate_target(tiny_llama, target, s, [0], method="a", **kwargs).to_dict()
    b = evaluate_target(tiny_llama, target, s, [0], method="b", **kwargs).to_dict()
    assert a == b and a["coupling"] == "coupled"
    a = evaluate_target(tiny_llama, target, s, [0], method="a", coupling="independent", **kwargs).to_dict()
    b = evaluate_target(tiny_llama, target, s, [0], method="b", coupling="independent", **kwargs).to_dict()
    assert a["metrics"] != b["metrics"] and a["coupling"] == "independent"
    with pytest.raises(LlmattrError, match="coupling"):
        evaluate_target(tiny_llama, target, s, [0], coupling="shared", **kwargs)


def test_same_seed_bit_identical_different_seed_different(tiny_llama):
    target = sentiment_target(tiny_llama)
    m = target.span[1] - target.span[0]
    expl = explanation_for(tiny_llama, target, torch.rand(1, m, generator=torch.Generator().manual_seed(0)))
    run = [evaluate(expl, tiny_llama, samples=3, seed=seed, pis=(0.25, 0.5, 0.75)).to_dict() for seed in (0, 0, 1)]
    assert run[0] == run[1]
    assert run[0]["metrics"] != run[2]["metrics"]
    assert mc_seed(0, "x", 0, "a") != mc_seed(0, "x", 0, "b") != mc_seed(0, "x", 5, "a")
    assert mc_seed(0, "x", 0) not in (mc_seed(0, "x", 0, "a"), mc_seed(1, "x", 0), mc_seed(0, "x", 1))


# ---------------------------------------------------------------------------------------- API
def test_evaluate_result_dict(tiny_llama):
    target = sentiment_target(tiny_llama)
    m = target.span[1] - target.span[0]
    expl = explanation_for(tiny_llama, target, torch.rand(1, m))
    data = evaluate(expl, tiny_llama, samples=2, routing="fixed").to_dict()
    assert set(data) == {"metrics", "routing", "samples", "seed", "mode", "coupling", "mc_se", "d0", "scope",
                         "warnings"}
    assert data["d0"] > 0 and data["scope"] == "span"
    assert set(data["metrics"]) == {"pi_soft_ns", "pi_soft_nc", "soft_ns", "soft_nc", "expected_retained"}
    for name in ("pi_soft_ns", "pi_soft_nc"):
        curve = data["metrics"][name]
        assert curve["x"] == list(PI_GRID) and len(curve["values"]) == 19 and "pi" not in curve
        assert curve["auc"] == pytest.approx(auc(curve["x"], curve["values"]))
        assert all(math.isfinite(v) for v in curve["values"])
    assert data["routing"] == "fixed" and data["samples"] == 2 and data["mode"] == "paper"
    assert set(data["mc_se"]) == {f"{m}_{f}" for m in ("pi_soft", "soft") for f in ("ns", "nc")} | {
        "pi_soft_ns_auc", "pi_soft_nc_auc"}
    assert len(data["mc_se"]["pi_soft_nc"]) == 19 and data["mc_se"]["pi_soft_ns_auc"] >= 0
    assert data["metrics"]["expected_retained"] == pytest.approx(sum(expl.steps[0].scores))


def test_a_result_written_with_the_old_pi_key_plots_as_one_with_x(tmp_path):
    """A pi-Soft curve's x is ``"x"`` (the store's word); a result dict (an ``--eval-json`` file) written before
    the rename holds it under ``"pi"`` and draws the same figure, byte for byte."""
    from llmattr.plotting import plot_pi_curves

    curve = {"values": [0.2, 0.35, 0.3], "auc": 0.3, "low": [0.1, 0.3, 0.2], "high": [0.3, 0.4, 0.4]}
    new = {"metrics": {"pi_soft_ns": {"x": [0.05, 0.5, 0.95], **curve}, "pi_soft_nc": None}}
    old = {"metrics": {"pi_soft_ns": {"pi": [0.05, 0.5, 0.95], **curve}, "pi_soft_nc": None}}
    drawn = [plot_pi_curves({"saliency": result}, tmp_path / f"{i}.png", title="t") for i, result in
             enumerate((new, old))]
    assert drawn[0].read_bytes() == drawn[1].read_bytes()


def test_target_from_explanation_round_trip(tiny_llama):
    target = sentiment_target(tiny_llama, answer=" Positive film", steps=3)
    scores = torch.rand(target.n_steps, target.span[1] - target.span[0])
    expl = Explanation.from_json(explanation_for(tiny_llama, target, scores).to_json())
    rebuilt = target_from_explanation(expl)
    assert torch.equal(rebuilt.input_ids, target.input_ids)
    assert rebuilt.span == target.span and torch.equal(rebuilt.positions, target.positions)


def test_generation_steps_every_stride(tiny_llama):
    target = sentiment_target(tiny_llama, answer=" Positive film cast the quick brown fox", steps=99)
    assert target.n_steps >= 7
    m = target.span[1] - target.span[0]
    expl = explanation_for(tiny_llama, target, torch.rand(target.n_steps, m), task="generate")
    result = evaluate(expl, tiny_llama, samples=1, pis=(0.5,), step_stride=3)
    assert result.steps == list(range(0, target.n_steps, 3))
    classification = explanation_for(tiny_llama, target, torch.rand(target.n_steps, m), task="sentiment")
    assert evaluate(classification, tiny_llama, samples=1, pis=(0.5,)).steps == [0]


def test_bad_input_errors(tiny_llama):
    target = sentiment_target(tiny_llama)
    m = target.span[1] - target.span[0]
    good = torch.rand(1, m)
    for scores in (torch.rand(1, m + 1), torch.rand(m), torch.full((1, m), float("nan")),
                   torch.full((1, m), float("inf")), torch.full((1, m), 1.5)):
        with pytest.raises(LlmattrError):
            evaluate_target(tiny_llama, target, scores, [0], samples=1)
    for kwargs in ({"pis": (0.0,)}, {"pis": (1.0,)}, {"samples": 0}, {"mode": "other"},
                   {"metrics": ("soft-xyz",)}, {"routing": "frozen"}):
        with pytest.raises(LlmattrError):
            evaluate_target(tiny_llama, target, good, [0], **{"samples": 1, **kwargs})
    expl = explanation_for(tiny_llama, target, good)
    with pytest.raises(LlmattrError):
        evaluate(expl, tiny_llama, step_stride=0)


# ---------------------------------------------------------------------------------------- ReAGent mode
@pytest.mark.parametrize("coupling", ["independent", "coupled"])
def test_reagent_mode_reproduces_original_code(tiny_tokenizer, coupling):
    """Per-dimension masks, one draw, sum (sqrt p - sqrt q)^2 / sqrt 2, NS = clamp(suff - suff0) / (1 - suff0).

    ``independent`` is the original code's draw (its own uniforms for NS and NC); ``coupled`` draws one
    set and NC keeps the dimensions NS drops."""
    lm = build_tiny("llama", tiny_tokenizer, seed=4, initializer_range=0.3)
    target = sentiment_target(lm)
    m, d = target.span[1] - target.span[0], lm.config.hidden_size
    s = torch.rand(1, m, generator=torch.Generator().manual_seed(7), dtype=torch.float64)
    expl = explanation_for(lm, target, s, method="m")
    s = expl.score_matrix()  # the retain probabilities (min-max of the raw scores)
    with pytest.raises(LlmattrError, match="scope 'all' was asked"):  # the code's scope is the default
        evaluate(expl, lm, pis=(0.5,), mode="reagent")
    result = evaluate(expl, lm, pis=(0.5,), mode="reagent", seed=3, samples=15, scope="span", coupling=coupling)
    assert result.samples == 1
    # the original evaluator, transcribed: full-sequence forwards, uniform < keep ratio per dimension
    from llmattr.faithfulness import example_key

    s_tilde = torch.cat([transform(s[0], torch.tensor([0.5], dtype=torch.float64)), s])
    gen = torch.Generator().manual_seed(mc_seed(3, example_key(expl), 0, "m" if coupling == "independent" else None))
    ratio_ns, ratio_nc = s_tilde, 1 - s_tilde
    u_ns = torch.rand((2, 1, m, d), generator=gen, dtype=torch.float64)
    u_nc = torch.rand((2, 1, m, d), generator=gen, dtype=torch.float64) if coupling == "independent" else 1 - u_ns
    ids = target.input_ids[0, : target.prompt_len]
    a, b = target.span
    wte = lm.embed(ids)[None]

    def prob(feature_mask):
        embeds = wte.clone()
        embeds[:, a:b] = embeds[:, a:b] * feature_mask.to(embeds.device)
        with torch.no_grad():
            return torch.softmax(lm.model(inputs_embeds=embeds).logits[0, -1], -1).double()

    def distance(p, q):
        return torch.sum(torch.pow(p.sqrt() - q.sqrt(), 2) / torch.sqrt(torch.tensor(2.0)))

    original = prob(torch.ones(m, d))
    suff0 = 1 - distance(prob(torch.zeros(m, d)), original)
    for row, (ns, nc) in enumerate(((result.pi_soft_ns[0], result.pi_soft_nc[0]),
                                    (result.soft_ns, result.soft_nc))):
        soft_suff = 1 - distance(prob((u_ns[row, 0] < ratio_ns[row, :, None]).float()), original)
        soft_comp = distance(prob((u_nc[row, 0] < ratio_nc[row, :, None]).float()), original)
        assert ns == pytest.approx(float(torch.clamp(soft_suff - suff0, min=0, max=10) / (1 - suff0)), abs=1e-5)
        assert nc == pytest.approx(float(soft_comp / (1 - suff0)), abs=1e-5)


# ---------------------------------------------------------------------------------------- real model
@pytest.mark.slow
def test_evaluate_real_explanation(smollm):
    import llmattr

    expl = llmattr.explain("A gorgeous, witty, seductive movie.", model=smollm)
    result = llmattr.evaluate(expl, smollm, samples=1, pis=(0.5,))
    data = result.to_dict()
    assert 0 <= data["metrics"]["soft_ns"] <= 1 and data["metrics"]["soft_nc"] >= 0
    assert math.isfinite(data["metrics"]["pi_soft_nc"]["auc"])


@pytest.mark.parametrize("c", [0.5, 2.0, 3.0])
def test_pi_soft_curves_of_s_and_its_powers_are_equal_through_the_public_api(tiny_llama, c):
    """Issue 48's acceptance: from_scores with s (exact 0s and 1s) and with s**c, evaluated with the same seed,
    give the same pi-Soft-NC/NS curves to 1e-9 (the clip of earlier versions moved them by up to 0.07)."""
    import llmattr

    expl = llmattr.explain(TEXT, model=tiny_llama, method="random", task="generate", answer=" over the")
    n_span = expl.span[1] - expl.span[0]
    s = with_limits(n_span, 11)[None].repeat(len(expl.steps), 1)
    curves = []
    for scores in (s, s**c):
        given = llmattr.from_scores(TEXT, scores.numpy(), model=tiny_llama, task="generate", answer=" over the")
        result = llmattr.evaluate(given, tiny_llama, samples=4, seed=5, step_stride=1, progress=False).to_dict()
        curves.append([result["metrics"][name]["values"] for name in ("pi_soft_ns", "pi_soft_nc")])
    assert max(abs(a - b) for x, y in zip(*curves, strict=True) for a, b in zip(x, y, strict=True)) <= 1e-9


def test_each_distinct_mask_of_a_step_goes_through_the_model_once(tiny_llama, monkeypatch):
    """On a short input coupled masks repeat (the fills make more of them): the model runs each distinct mask of the
    step once, the zero baseline included, and the values equal those of running every drawn mask."""
    target = sentiment_target(tiny_llama)
    m = target.span[1] - target.span[0]
    s = with_limits(m, 3)[None]
    forwarded = []
    plain = PerturbationEngine._forward

    def counted(self, keep):
        forwarded.append(keep.shape[0])
        return plain(self, keep)

    monkeypatch.setattr(PerturbationEngine, "_forward", counted)
    result = evaluate_target(tiny_llama, target, s, [0], samples=15, seed=4, example="ex")
    pis = check_pis(None)
    masks = draw_masks(torch.cat([transform(s[0], pis), s]), 15, torch.Generator().manual_seed(mc_seed(4, "ex", 0)))
    batch = torch.cat([torch.zeros(1, m)] + [mask.flatten(0, 1) for mask in masks.values()])
    assert sum(forwarded) == torch.unique(batch, dim=0).shape[0] < batch.shape[0]

    monkeypatch.setattr(PerturbationEngine, "probs", lambda self, keep, reuse=False: self._distinct_probs(keep))
    every = evaluate_target(tiny_llama, target, s, [0], samples=15, seed=4, example="ex").to_dict()["metrics"]
    ran = result.to_dict()["metrics"]
    float32 = 64 * torch.finfo(torch.float32).eps  # the same rows in other batches: the model's float32 rounding
    for name in ("pi_soft_ns", "pi_soft_nc"):
        torch.testing.assert_close(torch.tensor(ran[name]["values"]), torch.tensor(every[name]["values"]),
                                   rtol=0, atol=float32)
