"""The internals probe: exact eager attention for five architectures, recording and replay."""

import copy

import torch

from conftest import build_tiny
from llmattr.models.probe import Probe


def _eager_twin(lm):
    """The same weights under transformers' own eager attention."""
    twin = type(lm.model)(copy.deepcopy(lm.model.config))
    twin.load_state_dict(lm.model.state_dict())
    twin.set_attn_implementation("eager")
    return twin.eval()


def test_probed_logits_equal_eager_logits(tiny_lm):
    ids = torch.randint(3, len(tiny_lm.tokenizer), (2, 12), generator=torch.Generator().manual_seed(1))
    eager = _eager_twin(tiny_lm)(ids).logits
    plain = tiny_lm.model(ids).logits
    with Probe(record=True) as probe:
        recorded = tiny_lm.model(ids).logits
    torch.testing.assert_close(plain, eager, atol=1e-5, rtol=0)
    torch.testing.assert_close(recorded, eager, atol=1e-5, rtol=0)
    n_layers = tiny_lm.model.config.num_hidden_layers
    assert sorted(probe.layers) == list(range(n_layers))
    rec = probe.layers[0]
    heads = rec.q.shape[1]
    assert rec.probs.shape == (2, heads, 12, 12)
    assert rec.k.shape[1] == heads and rec.v.shape[1] == heads  # GQA heads repeated to query heads
    torch.testing.assert_close(rec.probs.sum(-1), torch.ones(2, heads, 12))


def test_recorded_output_is_probs_times_values(tiny_llama):
    ids = torch.arange(3, 13)[None]
    with Probe(record=True) as probe:
        tiny_llama.model(ids)
    rec = probe.layers[1]
    torch.testing.assert_close(rec.out, rec.probs @ rec.v)


def test_replay_fixes_attention_probabilities(tiny_tokenizer):
    lm = build_tiny("llama", tiny_tokenizer)
    ids = torch.arange(3, 13)[None]
    embeds = lm.embed(ids)
    with Probe(record=True) as clean:
        lm.model(inputs_embeds=embeds)
    cached = {i: r.probs.detach() for i, r in clean.layers.items()}
    with Probe(record=True, replay_probs=cached) as fixed:
        lm.model(inputs_embeds=embeds * 0.3)
    for i in cached:
        torch.testing.assert_close(fixed.layers[i].probs, cached[i])
    with Probe(record=True) as dynamic:
        lm.model(inputs_embeds=embeds * 0.3)
    assert not torch.allclose(dynamic.layers[1].probs, cached[1])


def test_value_scale_zeroes_one_token(tiny_tokenizer):
    lm = build_tiny("qwen2", tiny_tokenizer)
    ids = torch.arange(3, 11)[None].repeat(2, 1)
    scale = torch.ones(2, 8)
    scale[1, 4] = 0
    with Probe(record=True, value_scale=scale, value_layers={0}) as probe:
        lm.model(ids)
    assert torch.all(probe.layers[0].v[1, :, 4] == 0)
    assert torch.all(probe.layers[1].v[1, :, 4] != 0)
    assert torch.all(probe.layers[0].v[0, :, 4] != 0)
