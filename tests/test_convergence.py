"""Completeness of path methods and DeepLIFT: Captum's convergence delta per step in the Explanation."""

from __future__ import annotations

import json

import pytest
import torch
from captum.attr import IntegratedGradients

from conftest import build_tiny
from llmattr import methods
from llmattr.api import attribute, prepare
from llmattr.explanation import Explanation
from llmattr.methods import integrated
from llmattr.methods.deeplift import deeplift_attributions
from llmattr.methods.gradient import baseline_embeds, score_fn
from llmattr.models.forward import logits_at, prefix_key_values
from llmattr.request import Request
from llmattr.tasks import get_task

EPS32 = torch.finfo(torch.float32).eps


@pytest.fixture
def gen_target(tiny_llama):
    return prepare(tiny_llama, "A terrific film.", Request("sentiment", answer=" movie was"))


def endpoints(lm, target, baseline="all", kind="probability"):
    """``f``, ``x``, ``x0``, ``F(x) - F(x0)`` and the float32 rounding scale of those values (64 eps |F|)."""
    f, x = score_fn(lm, target, kind), lm.embed(target.input_ids).detach()
    x0 = baseline_embeds(lm, x, target, baseline)
    with torch.no_grad():
        fx, fx0 = f(x)[0].double(), f(x0)[0].double()
    return f, x, x0, fx - fx0, 64 * EPS32 * torch.maximum(fx.abs(), fx0.abs()).max().item()


@pytest.mark.parametrize("baseline", ["all", "span", "unk"])
def test_ig_convergence_delta_is_captums(tiny_llama, gen_target, baseline):
    """Captum's IntegratedGradients(return_convergence_delta=True) on each step gives the same delta (the
    span baseline skips the template's backward pass: its attributions are exactly zero)."""
    _, info = methods.get("integrated-gradients", baseline=baseline).attribute_with_info(tiny_llama, gen_target)
    f, x, x0, target_delta, tol = endpoints(tiny_llama, gen_target, baseline)
    assert info["target_delta"] == pytest.approx(target_delta.tolist(), abs=tol)
    for t in range(gen_target.n_steps):
        attr, delta = IntegratedGradients(lambda e, t=t: f(e)[:, t]).attribute(
            x, baselines=x0, n_steps=16, method="gausslegendre", return_convergence_delta=True)
        scale = attr.abs().sum().item()  # float32 sums of these terms
        assert abs(info["convergence_delta"][t] - float(delta)) <= 1e-5 * scale + tol


def full_sum(attr):
    return attr.double().sum((1, 2))


@pytest.mark.parametrize("name", ["igcg", "gradient-shap"])
def test_path_methods_report_sum_of_every_token_minus_target_delta(tiny_llama, gen_target, name):
    method = methods.get(name, **({"n_steps": 6} if name == "igcg" else {"n_samples": 3}))
    expl = attribute(tiny_llama, gen_target, method)
    _, _, _, target_delta, tol = endpoints(tiny_llama, gen_target)
    attr = method.attributions(tiny_llama, gen_target)  # every token, prefix included
    expected = (full_sum(attr) - target_delta).cpu()
    got = torch.tensor([s.convergence_delta for s in expl.steps], dtype=torch.float64)
    assert torch.allclose(got, expected, rtol=1e-4, atol=1e-6 * attr.abs().sum().item() + tol)
    assert [s.target_delta for s in expl.steps] == pytest.approx(target_delta.tolist(), abs=tol)


def test_aieg_delta_is_that_of_its_integral_before_reweighting(tiny_llama, gen_target, monkeypatch):
    """With every emphasis factor 1, AIEG's integral is right-Riemann IG: the same convergence delta."""
    monkeypatch.setattr(integrated, "emphasis_factor", lambda now, prev: torch.ones_like(now))
    _, info = methods.get("aieg", n_steps=6).attribute_with_info(tiny_llama, gen_target)
    ig = methods.get("integrated-gradients", n_steps=6, method="riemann_right")
    _, ref = ig.attribute_with_info(tiny_llama, gen_target)
    assert info["convergence_delta"] == pytest.approx(ref["convergence_delta"], rel=1e-4, abs=1e-9)


@pytest.mark.parametrize("baseline", ["all", "unk"])
def test_deeplift_records_summation_to_delta(tiny_llama, gen_target, baseline):
    expl = attribute(tiny_llama, gen_target, methods.get("deeplift", baseline=baseline, objective="logit"))
    f, x, x0, target_delta, tol = endpoints(tiny_llama, gen_target, baseline, "logit")
    attr, _ = deeplift_attributions(f, x, x0)
    for step, td, total in zip(expl.steps, target_delta.tolist(), full_sum(attr).tolist(), strict=True):
        assert step.target_delta == pytest.approx(td, abs=tol)
        assert step.convergence_delta == pytest.approx(total - td, abs=tol)
        assert abs(step.convergence_delta) <= 1e-3 * abs(step.target_delta)


def test_json_round_trip_and_cli_verbose(tiny_llama, tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from llmattr.cli import app

    monkeypatch.setattr("llmattr.models.loading.load_model", lambda *args, **kwargs: tiny_llama)
    out = tmp_path / "e.json"
    args = ["explain", "A terrific film.", "--task", "generate", "--answer", " movie was", "--method",
            "integrated-gradients", "--param", "n_steps=4", "--json", str(out)]
    quiet = CliRunner().invoke(app, args)
    loud = CliRunner().invoke(app, [*args, "--verbose"])
    assert quiet.exit_code == loud.exit_code == 0, loud.output
    steps = json.loads(out.read_text())["steps"]
    assert all(isinstance(s["convergence_delta"], float) and isinstance(s["target_delta"], float) for s in steps)
    assert Explanation.from_json(out).steps[0].convergence_delta == steps[0]["convergence_delta"]
    assert "convergence_delta" in loud.output and "convergence_delta" not in quiet.output
    plain = attribute(tiny_llama, prepare(tiny_llama, "A terrific film.", Request("generate", answer=" movie")),
                      methods.get("saliency"))
    assert plain.steps[0].convergence_delta is None


@pytest.mark.parametrize("arch", ["llama", "gemma3", "gpt2"])
def test_template_share_through_its_cache_is_its_summed_attribution(tiny_tokenizer, arch, monkeypatch):
    """The template runs as a PathPrefix (keys/values per path point, their forward-mode derivatives): the
    backward stops at the span, and the template's share <dF/dKV, dKV> of the delta equals the sum of its
    attributions from a full backward. The second example of the task reuses the prefix (computed once)."""
    from llmattr.models.forward import PathPrefix

    lm = build_tiny(arch, tiny_tokenizer)
    computed = []
    compute = PathPrefix.compute.__func__
    monkeypatch.setattr(PathPrefix, "compute", classmethod(lambda cls, *a: computed.append(1) or compute(cls, *a)))
    task, ig = get_task("sentiment"), methods.get("integrated-gradients", n_steps=5)
    for text in ("A terrific film.", "Dull, slow and far too long."):
        target = prepare(lm, text, Request(task, answer=" movie was"))
        scores, info = ig.attribute_with_info(lm, target)
        kept = [value for (kind, _), value in lm.kept.entries.items() if kind == "path-prefix"]
        assert target.span[0] > 0 and len(kept) == 1 and kept[0].tangents is not None
        full = ig.attributions(lm, target)  # every token through the graph
        _, _, _, target_delta, tol = endpoints(lm, target)
        expected = (full_sum(full) - target_delta).cpu()
        scale = (full.abs().sum((1, 2)).double() * 1e-5 + tol).cpu()  # float32 sums of these terms
        assert (torch.tensor(info["convergence_delta"], dtype=torch.float64) - expected).abs().le(scale).all()
        a, b = target.span
        ref = full[:, a:b].sum(-1).to(scores.device)
        assert torch.allclose(scores, ref, atol=1e-5 * full[:, a:b].abs().sum().item())
        if arch != "gemma3":  # the tiny Gemma-3's 4-token sliding window hides the template from the steps
            template = full[:, :a].double().sum((1, 2))
            assert template.abs().max() > 1e-3 * full.abs().sum()  # the template's share is not negligible
    assert computed == [1]


@pytest.mark.parametrize("arch", ["llama", "qwen2", "gemma3", "gpt2"])
def test_zero_input_logits_are_a_forward_of_zeros_and_share_one_kept_prefix(tiny_tokenizer, arch, monkeypatch):
    """The zero baseline's logits come from a slice of one kept all-zero prefix: equal to a forward of the zeros at
    every length asked, the prefix run again only when a longer one is needed (and never for position 0)."""
    from llmattr.models import forward

    lm = build_tiny(arch, tiny_tokenizer)
    runs = []
    monkeypatch.setattr(forward, "prefix_key_values", lambda *a: runs.append(a[1].shape[1]) or prefix_key_values(*a))
    like = lm.embed(torch.tensor([[1, 2]])).detach()
    for positions in (torch.arange(9, 12), torch.tensor([5]), torch.arange(0, 2), torch.tensor([14, 15])):
        zeros = like.new_zeros(1, int(positions[-1]) + 1, like.shape[-1])
        with torch.no_grad():
            want = logits_at(lm, zeros, positions)
        got = forward.zero_input_logits(lm, positions, like)
        scale = want.abs().amax().item()  # float32 rounding of these logits
        torch.testing.assert_close(got, want, rtol=0, atol=1e-5 * scale)
    assert runs == [9, 14]


def test_known_endpoints_run_no_forward(tiny_llama, monkeypatch):
    """A generated target's F(x) is read off its generation's logits and the zero baseline's F(x0) off the kept
    zero prefix: no endpoint row runs, and the delta is that of a forward of both; a forced answer runs x alone, the
    span baseline (not all zero) runs x0 alone."""
    lm, task = tiny_llama, get_task("generate")
    ig = methods.get("integrated-gradients", n_steps=4)
    generated = prepare(lm, "A terrific film.", Request(task, max_new_tokens=3))
    forced = prepare(lm, "A terrific film.", Request(task, answer=" movie was"))
    assert generated.step_logits is not None and forced.step_logits is None
    for target, baseline, rows in ((generated, "all", []), (forced, "all", [1]), (generated, "span", [1])):
        f, x, _ = ig.inputs(lm, target, target.span[0])
        x0 = integrated.baseline_embeds(lm, x, target, baseline)
        seen = []
        counted = lambda e, seen=seen, f=f: seen.append(len(e)) or f(e)  # noqa: E731
        got = integrated.endpoint_delta(lm, target, *ig.explained(lm), counted, x, x0)
        _, _, _, want, tol = endpoints(lm, target, baseline)
        logit_scale = 1e-5 * (generated.step_logits.abs().amax().item() + 1)  # the generation's float32 rounding
        assert seen == rows
        assert got.double().cpu() == pytest.approx(want.cpu().tolist(), abs=tol + logit_scale)
