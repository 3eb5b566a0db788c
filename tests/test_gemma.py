"""Gemma-3-270M base: a second real architecture (sliding-window layers of 512 tokens, a 262k vocabulary).

A prompt longer than the window checks what the tiny models cannot at real scale: the probe attention
equals transformers' eager attention, the window really changes the answer, and a shared key/value
prefix longer than the window gives the full forward's logits. Then every method runs on a sentiment
prompt and a 10-token generation.
"""

from __future__ import annotations

import copy
import gc
import json

import pytest
import torch

from conftest import token_methods
from llmattr import methods
from llmattr.api import prepare
from llmattr.models.forward import SharedPrefix, logits_at
from llmattr.request import Request

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def long_target(gemma, shared_data):
    with open(shared_data / "imdb.jsonl") as handle:
        text = max((json.loads(line)["text"] for line in handle), key=len)[:4000]
    target = prepare(gemma, text, Request("sentiment", answer=" positive"))
    assert target.input_ids.shape[1] > gemma.model.config.get_text_config().sliding_window + 300
    return target


@torch.no_grad()
def twin_logits(lm, input_ids, **config) -> torch.Tensor:
    """Last-position logits of a copy of the model under transformers' eager attention (config overrides)."""
    cfg = copy.deepcopy(lm.model.config)
    for key, value in config.items():
        setattr(cfg, key, value)
    twin = type(lm.model)(cfg)
    twin.load_state_dict(lm.model.state_dict())
    twin.set_attn_implementation("eager")
    logits = twin.eval()(input_ids).logits[0, -1]
    del twin
    gc.collect()
    return logits


def test_probe_equals_eager_attention_and_the_window_matters(gemma, long_target):
    ids = long_target.input_ids
    with torch.no_grad():
        ours = gemma.model(ids).logits[0, -1]
    torch.testing.assert_close(ours, twin_logits(gemma, ids), atol=1e-4, rtol=1e-4)
    assert (twin_logits(gemma, ids, sliding_window=10**6) - ours).abs().max() > 1.0


def test_shared_prefix_longer_than_the_window(gemma, long_target):
    ids, window = long_target.input_ids, gemma.model.config.get_text_config().sliding_window
    positions = torch.tensor([window + 120, ids.shape[1] - 1])
    with torch.no_grad():
        full = logits_at(gemma, gemma.embed(ids), positions)
        for length in (long_target.span[0], window + 60):
            prefix = SharedPrefix.compute(gemma, ids, length)
            cached = prefix.logits_at(gemma, gemma.embed(ids[:, length:]), positions)
            torch.testing.assert_close(cached, full, atol=1e-4, rtol=1e-4)


CHEAP = {"integrated-gradients": {"n_steps": 4}, "igcg": {"n_steps": 4}, "aieg": {"n_steps": 4},
         "gradient-shap": {"n_samples": 2}, "lime": {"n_samples": 8},
         "reagent": {"max_probe_steps": 2, "num_probes": 1}}


def test_every_method_on_gemma(gemma):
    sentiment = prepare(gemma, "An engrossing film that is never boring.", Request("sentiment", answer=" positive"))
    generation = prepare(gemma, "The fox", Request("generate", max_new_tokens=10))
    assert generation.n_steps == 10
    for name in token_methods():
        method = methods.get(name, **CHEAP.get(name, {}))
        for target in (sentiment, generation):
            raw = method.attribute(gemma, target)
            assert raw.shape == (target.n_steps, target.span[1] - target.span[0]), name
            assert torch.isfinite(raw).all(), name


@pytest.mark.parametrize("baseline", ["all", "unk"])
def test_deeplift_sums_to_delta_on_gemma(gemma, baseline):
    """Gemma-3's post-norms of small activations: the rescale rule must use the secant wherever x and x0
    differ (an absolute near-zero threshold broke this by ~3% from the unk reference)."""
    from llmattr.methods.deeplift import deeplift_attributions
    from llmattr.methods.gradient import baseline_embeds, score_fn

    target = prepare(gemma, "An engrossing film that is never boring.", Request("sentiment", answer=" positive"))
    f, x = score_fn(gemma, target, "logit"), gemma.embed(target.input_ids).detach()
    attr, delta = deeplift_attributions(f, x, baseline_embeds(gemma, x, target, baseline))
    assert delta.abs().min() > 0.1
    torch.testing.assert_close(attr.sum((1, 2)), delta, rtol=1e-3, atol=1e-4)
