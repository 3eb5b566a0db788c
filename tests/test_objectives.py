"""The objectives registry (what is explained) and the contrastive objective through every scoring method."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch
from typer.testing import CliRunner

from conftest import build_tiny
from llmattr import methods, objectives
from llmattr.api import explain, prepare
from llmattr.cli import app
from llmattr.errors import LlmattrError
from llmattr.explanation import Explanation
from llmattr.methods.gradient import embedding_gradients, score_fn
from llmattr.request import Request
from llmattr.targets import with_scope

EPS = torch.finfo(torch.float32).eps
TEXT = "A terrific film."
SCORING = ("saliency", "input-x-gradient", "integrated-gradients", "igcg", "aieg", "gradient-shap", "deeplift",
           "deeplift-ixg", "grad-ellm", "lime", "reagent")
LINEAR = ("input-x-gradient", "integrated-gradients", "gradient-shap", "deeplift", "deeplift-ixg")


def test_each_objective_by_hand():
    logits = torch.tensor([[[1.0, 2.0, 0.5], [0.0, -1.0, 3.0]]])  # (B=1, T=2, V=3)
    target, foil = torch.tensor([1, 2]), torch.tensor(0)
    log_p = torch.log_softmax(logits, -1)[0]
    want = {
        "probability": log_p.exp()[[0, 1], [1, 2]],
        "log-prob": log_p[[0, 1], [1, 2]],
        "logit": torch.tensor([2.0, 3.0]),
        "contrast": torch.tensor([2.0 - 1.0, 3.0 - 0.0]),
        "contrast-prob": log_p.exp()[[0, 1], [1, 2]] - log_p.exp()[:, 0],
    }
    assert set(objectives.OBJECTIVES) == set(want)
    for name, value in want.items():
        got = objectives.get(name, foil if objectives.OBJECTIVES[name].contrastive else None)(logits, target, foil)
        torch.testing.assert_close(got[0], value)


def test_objective_and_foil_checks_are_one_line():
    with pytest.raises(LlmattrError, match="unknown objective 'prob'"):
        objectives.get("prob")
    with pytest.raises(LlmattrError, match="give --foil WORD"):
        methods.get("saliency", objective="contrast")
    with pytest.raises(LlmattrError, match="--foil needs a contrastive objective"):
        methods.get("lime", foil="Negative")
    for name in ("attention", "value-zeroing", "logat", "normxlogit", "l2-norm", "random"):
        with pytest.raises(LlmattrError, match=f"method {name} scores no model output"):
            methods.get(name, objective="logit")


def test_methods_json_says_what_each_method_explains():
    from llmattr.cli.methods import methods_records

    records = {r["name"]: r["objective"] for r in methods_records()}
    assert records == {name: methods.REGISTRY[name].objective for name in methods.available()}
    assert records["grad-ellm"] == "logit" and records["attention"] is None


def test_defaults_unchanged():
    """Each method keeps its objective; only the gradient family lists ``target`` among its parameters."""
    assert {n: methods.REGISTRY[n].objective for n in SCORING} == {
        **{n: "probability" for n in SCORING}, "grad-ellm": "logit"}
    assert "target" not in methods.get("lime").params and "foil" not in methods.get("saliency").params


@pytest.fixture
def linear_lm(tiny_tokenizer):
    """A Llama with no blocks and no final norm: ``logits_t = W x_t``, linear in the input embeddings."""
    lm = build_tiny("llama", tiny_tokenizer, num_hidden_layers=0)
    lm.model.model.norm = torch.nn.Identity()
    return lm


def one_step(lm, scope: str = "prompt"):
    """A forced one-token answer; ``scope="prompt"`` puts the predicting (last prompt) position in the span."""
    target = with_scope(prepare(lm, TEXT, Request("sentiment", answer="Positive")), scope)
    assert target.n_steps == 1
    return target


def test_contrast_known_by_construction(linear_lm):
    """``F = logit(y) - logit(f) = (W_y - W_f) . x_last``: every method's contrast is that by hand.

    Gradient: ``W_y - W_f`` at the last position, 0 elsewhere; Input x Gradient, IG and DeepLIFT (zero
    baseline, ``F(0) = 0``): ``x_last . (W_y - W_f)`` there; LIME without ridge penalty fits ``F(mask)`` =
    ``mask_last * x_last . (W_y - W_f)`` exactly: the change of the contrast when the last token is removed.
    """
    target = one_step(linear_lm)
    foil = 7
    y = int(target.target_ids[0])
    w = linear_lm.model.get_output_embeddings().weight
    x = linear_lm.embed(target.input_ids)[0].detach()
    direction = w[y] - w[foil]
    contrast = float(x[-1] @ direction)
    want = torch.zeros(1, x.shape[0])
    want[0, -1] = contrast
    tol = 1e3 * EPS * float(x[-1].abs() @ direction.abs())  # float32 rounding of the D-term dot product

    f = score_fn(linear_lm, target, "contrast", foil_ids=torch.tensor(foil))
    scores, grads = embedding_gradients(f, x[None])
    assert float(scores[0, 0]) == pytest.approx(contrast, abs=tol)
    torch.testing.assert_close(grads[0, 0, -1], direction, rtol=0, atol=tol)
    assert float(grads[0, 0, :-1].abs().max()) == 0.0
    saliency = methods.get("saliency", objective="contrast", foil=foil).attribute(linear_lm, target)
    torch.testing.assert_close(saliency[0, -1], direction.norm(), rtol=0, atol=tol)
    for name in ("input-x-gradient", "integrated-gradients", "deeplift", "deeplift-ixg"):
        got = methods.get(name, objective="contrast", foil=foil).attribute(linear_lm, target)
        torch.testing.assert_close(got, want, rtol=0, atol=tol, msg=name)
    lime = methods.get("lime", objective="contrast", foil=foil, alpha=0.0, n_samples=256, batch_size=64)
    lime = lime.attribute(linear_lm, target)  # 256 samples > 82 tokens + intercept: an exact fit
    torch.testing.assert_close(lime, want, rtol=0, atol=tol * x.shape[0])


def test_contrast_is_the_difference_of_the_two_logits(tiny_llama):
    """Linear-in-output methods: attribution(contrast) = attribution(logit y) - attribution(logit f), on a
    random 2-layer model (the foil's attribution from the same prompt with the foil as the explained token)."""
    target = one_step(tiny_llama, scope="span")
    foil = 7
    as_foil = replace(target, target_ids=torch.tensor([foil]))
    x = tiny_llama.embed(target.input_ids).detach()
    g_contrast = embedding_gradients(score_fn(tiny_llama, target, "contrast", foil_ids=torch.tensor(foil)), x)[1]
    g_y = embedding_gradients(score_fn(tiny_llama, target, "logit"), x)[1]
    g_f = embedding_gradients(score_fn(tiny_llama, as_foil, "logit"), x)[1]
    scale = float((g_y.abs() + g_f.abs()).max())
    torch.testing.assert_close(g_contrast, g_y - g_f, rtol=0, atol=1e2 * EPS * scale)
    for name in LINEAR:
        params = {"n_samples": 3} if name == "gradient-shap" else {"n_steps": 4} if "integrated" in name else {}
        contrast = methods.get(name, objective="contrast", foil=foil, **params).attribute(tiny_llama, target)
        of_y = methods.get(name, objective="logit", **params).attribute(tiny_llama, target)
        of_f = methods.get(name, objective="logit", **params).attribute(tiny_llama, as_foil)
        tol = 1e3 * EPS * float((of_y.abs() + of_f.abs()).max())
        torch.testing.assert_close(contrast, of_y - of_f, rtol=0, atol=tol, msg=name)


def test_contrast_runs_through_every_scoring_method_and_is_recorded(tiny_llama):
    small = {"integrated-gradients": {"n_steps": 2}, "igcg": {"n_steps": 2}, "aieg": {"n_steps": 2},
             "gradient-shap": {"n_samples": 2}, "lime": {"n_samples": 8}, "reagent": {"max_probe_steps": 2}}
    for name in SCORING:
        expl = explain(TEXT, model=tiny_llama, method=name, answer="Positive", objective="contrast",
                       foil="Negative", progress=False, **small.get(name, {}))
        assert expl.params["objective"] == "contrast" and expl.params["foil"] == "Negative"
        assert json.loads(expl.to_json())["params"]["foil"] == "Negative"
        assert torch.isfinite(expl.score_matrix(raw=True)).all(), name


def test_foil_must_be_one_token(tiny_llama):
    with pytest.raises(LlmattrError, match=r"foil .terrific film. is \d+ tokens"):
        explain(TEXT, model=tiny_llama, method="saliency", objective="contrast", foil="terrific film")


@pytest.mark.slow
def test_contrast_on_the_embedded_model(smollm, tmp_path):
    """``explain --objective contrast --foil " Negative"`` on SmolLM2 for every gradient and perturbation
    method (minimal steps and samples); the CLI once, its JSON records the foil."""
    small = {"integrated-gradients": {"n_steps": 2}, "igcg": {"n_steps": 2}, "aieg": {"n_steps": 2},
             "gradient-shap": {"n_samples": 2}, "lime": {"n_samples": 8},
             "reagent": {"max_probe_steps": 2, "num_probes": 1}}
    for name in SCORING:
        expl = explain("Great fun.", model=smollm, method=name, objective="contrast", foil=" Negative",
                       progress=False, **small.get(name, {}))
        assert expl.params["foil"] == " Negative" and torch.isfinite(expl.score_matrix(raw=True)).all(), name
    out = tmp_path / "e.json"
    result = CliRunner().invoke(app, ["explain", "Great fun.", "--method", "input-x-gradient", "--objective",
                                      "contrast", "--foil", " Negative", "--device", "cpu", "--json", str(out)])
    assert result.exit_code == 0, result.output
    assert json.loads(out.read_text())["params"] == {"objective": "contrast", "foil": " Negative", "reduction": "sum"}


def test_a_method_takes_objective_or_its_old_name_target():
    """``objective=`` names the concept (the defaults' key, what is recorded); ``target=``, its name before issue 22,
    still works and gives the same method and scores; both at once are refused; a method reading
    ``params["target"]`` (written before the rename) still gets the objective."""
    new, old = methods.get("saliency", objective="logit"), methods.get("saliency", target="logit")
    assert new.params == old.params == {"objective": "logit", "reduction": "l2"}
    assert "target" not in old.params and old.params["target"] == old.params.get("target") == "logit"
    assert methods.get("saliency").params.get("target") == "probability"
    for name in ("saliency", "input-x-gradient", "integrated-gradients", "gradient-shap", "aieg", "deeplift",
                 "deeplift-ixg", "attnlrp", "cp-lrp"):
        assert "objective" in methods.REGISTRY[name].defaults and "target" not in methods.REGISTRY[name].defaults
    with pytest.raises(LlmattrError, match="give objective= or its old name target=, not both"):
        methods.get("saliency", objective="logit", target="probability")
    with pytest.raises(LlmattrError, match="takes no objective"):
        methods.get("attention", objective="logit")
    with pytest.raises(LlmattrError, match="takes no objective"):
        methods.get("attention", target="logit")


def test_the_old_spelling_target_gives_the_same_scores(tiny_llama):
    target = prepare(tiny_llama, TEXT, Request("sentiment", answer="Positive"))
    for name in ("input-x-gradient", "deeplift"):
        new = methods.get(name, objective="logit").attribute(tiny_llama, target)
        old = methods.get(name, target="logit").attribute(tiny_llama, target)
        torch.testing.assert_close(new, old, rtol=0, atol=0)
    via_api = explain(TEXT, model=tiny_llama, method="saliency", answer="Positive", target="logit", progress=False)
    assert via_api.params["objective"] == "logit"  # explain(target="logit"): the objective, the label explained


def test_an_explanation_json_of_before_the_rename_reads_target_as_objective(tiny_llama):
    expl = explain(TEXT, model=tiny_llama, method="saliency", answer="Positive", objective="logit", progress=False)
    data = json.loads(expl.to_json())
    data["params"] = {"target": "logit", "reduction": "sum"}
    assert Explanation.from_json(json.dumps(data)).params == {"objective": "logit", "reduction": "sum"}


def test_the_cli_takes_objective_and_the_old_spelling():
    """``explain --objective`` (one option, the own one with the objectives' list), ``--param target=...`` and
    ``evaluate --methods name:target=...`` as the old spelling, recorded as ``objective``."""
    from llmattr.evaluation.method_specs import parse_method

    result = CliRunner().invoke(app, ["explain", "--help"], terminal_width=200)
    assert result.output.count("--objective") >= 1 and "--target " in result.output
    assert parse_method("saliency:target=logit") == parse_method("saliency:objective=logit")
    assert parse_method("saliency:target=logit").key == '{"objective":"logit","reduction":"l2"}'
    assert parse_method("saliency:objective=logit").label == "saliency:objective=logit"
    with pytest.raises(LlmattrError, match="not both"):
        parse_method("saliency:target=logit:objective=logit")
    bad = CliRunner().invoke(app, ["explain", "x", "--objective", "logit", "--param", "target=probability"])
    assert isinstance(bad.exception, LlmattrError) and "not both" in str(bad.exception)  # before any model load
