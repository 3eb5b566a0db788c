"""Scope: one choice of what is attributed and what the metrics perturb and zero (span, prompt, all)."""

from __future__ import annotations

import json

import pytest
import torch

import llmattr
from conftest import token_methods
from llmattr import methods
from llmattr.api import attribute, prepare
from llmattr.errors import LlmattrError
from llmattr.evaluation import EvalConfig, run, run_settings
from llmattr.faithfulness import evaluate
from llmattr.faithfulness.soft import hellinger
from llmattr.request import Request

TEXT = "A terrific film."
CHEAP = {"integrated-gradients": {"n_steps": 2}, "igcg": {"n_steps": 2}, "aieg": {"n_steps": 2},
         "gradient-shap": {"n_samples": 2}, "lime": {"n_samples": 8},
         "reagent": {"max_probe_steps": 2, "num_probes": 1, "sampler": "uniform"}}  # causal: needs a token before


def generation(lm, scope):
    return prepare(lm, TEXT, Request("generate", answer=" movie was great", scope=scope))


@torch.no_grad()
def zeroed_distance(lm, target, step: int, zero: slice) -> float:
    """Hellinger distance between the clean next-token distribution at ``step`` and the one with the
    embeddings at ``zero`` set to 0, by a plain full forward."""
    ids = target.input_ids[:, : int(target.positions[step]) + 1]
    embeds = lm.embed(ids)
    clean = torch.softmax(lm.model(inputs_embeds=embeds).logits[0, -1].double(), -1)
    embeds[:, zero] = 0
    return float(hellinger(clean, torch.softmax(lm.model(inputs_embeds=embeds).logits[0, -1].double(), -1)))


def test_scope_sets_what_is_attributed(tiny_llama):
    span, prompt, every = (generation(tiny_llama, scope) for scope in ("span", "prompt", "all"))
    n = prompt.prompt_len
    assert span.span == span.prompt.span and 0 < span.span[0] and span.span[1] < n
    assert prompt.span == (0, n) and every.span == (0, n + every.n_steps - 1)
    for name in token_methods():  # every method attributes whichever scope is asked
        expl = attribute(tiny_llama, every, methods.get(name, **CHEAP.get(name, {})))
        assert len(expl.steps[0].raw) == n + every.n_steps - 1 and expl.scope == "all"
        assert expl.span_tokens[n:] == [s.token for s in expl.steps[:-1]]  # the generated prefix
    with pytest.raises(LlmattrError, match="scope must be one of"):
        prepare(tiny_llama, TEXT, Request("generate", scope="content"))


def test_prompt_scope_attributes_every_input_of_a_path_method(tiny_llama):
    """Over the whole prompt, IG's scores hold all of its completeness: sum = target_delta + convergence_delta."""
    target = prepare(tiny_llama, TEXT, Request("generate", answer=" movie", scope="prompt"))
    expl = attribute(tiny_llama, target, methods.get("integrated-gradients"))
    step = expl.steps[0]
    assert sum(step.raw) == pytest.approx(step.target_delta + step.convergence_delta, rel=1e-4, abs=1e-9)


@pytest.mark.parametrize("scope", ["span", "prompt", "all"])
def test_metrics_zero_and_perturb_the_scope(tiny_llama, scope):
    """D0 of the evaluation = the distance with exactly the scope's visible tokens zeroed, at every step."""
    target = generation(tiny_llama, scope)
    expl = attribute(tiny_llama, target, methods.get("random"))
    result = evaluate(expl, tiny_llama, samples=2, pis=(0.5,), step_stride=1)
    a, n = target.span[0], target.n_steps
    assert n > 2
    ends = {"span": [target.span[1]] * n, "prompt": [target.prompt_len] * n,
            "all": [int(p) + 1 for p in target.positions]}[scope]
    expected = [zeroed_distance(tiny_llama, target, t, slice(a, ends[t])) for t in range(n)]
    assert result.d0 == pytest.approx(sum(expected) / n, rel=1e-5) and result.scope == scope
    assert result.to_dict()["d0"] == result.d0
    assert result.expected_retained == pytest.approx(
        sum(sum(expl.steps[t].scores[: ends[t] - a]) for t in range(n)) / n, rel=1e-9)


def test_evaluate_refuses_a_scope_the_explanation_does_not_attribute(tiny_llama):
    expl = attribute(tiny_llama, generation(tiny_llama, "span"), methods.get("random"))
    with pytest.raises(LlmattrError, match="explanation has scope 'span', scope 'prompt' was asked"):
        evaluate(expl, tiny_llama, scope="prompt", samples=1, pis=(0.5,))
    with pytest.raises(LlmattrError, match="mode='reagent'"):  # the ReAGent code perturbs prompt + prefix
        evaluate(expl, tiny_llama, mode="reagent", pis=(0.5,))
    every = attribute(tiny_llama, generation(tiny_llama, "all"), methods.get("random"))
    assert evaluate(every, tiny_llama, mode="reagent", pis=(0.5,)).scope == "all"
    one = attribute(tiny_llama, prepare(tiny_llama, TEXT, Request("generate", answer="Positive",
                                        scope="prompt")), methods.get("random"))
    assert len(one.steps) == 1
    assert evaluate(one, tiny_llama, mode="reagent", pis=(0.5,)).scope == "prompt"  # one step: the same tokens


def test_runner_stores_scope_and_removal(tiny_llama, tmp_path, shared_data):
    from llmattr.faithfulness import METRICS, MetricContext, get_metrics
    from llmattr.faithfulness.ranking import ranking_metrics
    from llmattr.store import Store

    cfg = EvalConfig(datasets=["sst2"], methods=["random"], metrics=["soft", "log-odds"], n=2, samples=2,
                     scope="prompt", removal="delete", out=str(tmp_path / "r.sqlite"))
    settings = run_settings(cfg, get_metrics(cfg.metrics), tiny_llama)
    assert settings["scope"] == "prompt" and settings["removal"] == "delete" and settings["target"] == "label"
    summary = run(cfg, lm=tiny_llama, progress=False)
    assert summary.computed == 2 and not summary.failed
    with Store(cfg.out) as store:
        text = store.conn.execute("SELECT explanation FROM explanations LIMIT 1").fetchone()[0]
    expl = llmattr.Explanation.from_json(text)
    assert expl.scope == "prompt" and expl.span[0] == 0 and expl.classification["predicted"] in ("Positive",
                                                                                                 "Negative")
    rows = METRICS["log-odds"].compute(MetricContext(tiny_llama, expl, cfg.metric_options()), "none")
    assert rows[0].value == ranking_metrics(expl, tiny_llama, removal="delete").log_odds
    with pytest.raises(LlmattrError, match="removal must be one of"):
        run(EvalConfig(removal="drop", out=str(tmp_path / "x.sqlite")), lm=tiny_llama, progress=False)


def test_cli_explain_scope_with_evaluate(tiny_llama, tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from llmattr.cli import app

    monkeypatch.setattr("llmattr.models.loading.load_model", lambda *args, **kwargs: tiny_llama)
    out = tmp_path / "e.json"
    result = CliRunner().invoke(app, ["explain", TEXT, "--task", "generate", "--answer", " movie", "--method",
                                      "random", "--scope", "prompt", "--evaluate", "--samples", "1", "--json",
                                      str(out)])
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())
    assert data["scope"] == "prompt" and data["span"][0] == 0 and data["evaluation"]["scope"] == "prompt"
    assert data["d0"] == data["evaluation"]["d0"] > 0 and "D0" in result.output
