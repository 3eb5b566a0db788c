"""Long inputs in bounded memory: every method through the sdpa probe equals the full eager computation."""

from __future__ import annotations

import torch

from llmattr import methods
from llmattr.api import prepare
from llmattr.methods.value_zeroing import value_zeroing_distances
from llmattr.models.forward import logits_at
from llmattr.models.probe import eager_attention
from llmattr.tasks import get_task

CHEAP = {"integrated-gradients": {"n_steps": 4}, "igcg": {"n_steps": 4}, "aieg": {"n_steps": 4},
         "gradient-shap": {"n_samples": 2}, "lime": {"n_samples": 16},
         "reagent": {"max_probe_steps": 3, "num_probes": 2}}


def test_every_method_equals_the_eager_computation(tiny_lm):
    """sdpa attention and rows-only probe records give every method's scores of the full eager attention (the
    computation before the sdpa probe), on all five architectures (Gemma3's window of 4 included), to float
    tolerance relative to the scores' own scale."""
    target = prepare(tiny_lm, "An engrossing film that is never boring, with a terrific cast.",
                     get_task("sentiment"), answer=" movie was")
    with torch.no_grad():
        logits = logits_at(tiny_lm, tiny_lm.embed(target.input_ids), target.positions)[0]
    # LIME's ridge (alpha = 1) shrinks its coefficients far below the probability it regresses, whose float
    # error is what carries over: compare on that probability's scale
    probability = torch.softmax(logits.float(), -1).gather(-1, target.target_ids[:, None]).amax()
    for name in sorted(set(methods.available()) - {"value-zeroing"}):  # its distances are compared below
        method = methods.get(name, **CHEAP.get(name, {}))
        got = method.attribute(tiny_lm, target)
        with eager_attention():
            want = method.attribute(tiny_lm, target)
        scale = probability if name == "lime" else want.abs().amax().clamp_min(torch.finfo(torch.float32).tiny)
        torch.testing.assert_close(got / scale, want / scale, atol=1e-4, rtol=0, msg=name)


def test_value_zeroing_distances_equal_the_eager_computation(tiny_lm):
    """Value zeroing's 1 - cos distances (~1e-5 on tiny random models, so normalising them would magnify float
    noise) agree to a few float32 steps of cos near 1."""
    target = prepare(tiny_lm, "An engrossing film that is never boring, with a terrific cast.",
                     get_task("sentiment"), answer=" movie was")
    layers = list(range(tiny_lm.config.num_hidden_layers))
    got = value_zeroing_distances(tiny_lm, target.input_ids, target.positions, target.span, layers, 8)
    with eager_attention():
        want = value_zeroing_distances(tiny_lm, target.input_ids, target.positions, target.span, layers, 8)
    torch.testing.assert_close(got, want, atol=16 * torch.finfo(torch.float32).eps, rtol=0)
