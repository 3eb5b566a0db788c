"""The internals probe: sdpa attention equal to transformers' eager attention for five architectures; recording
of the asked rows only, replay of the clean routing, value scaling, and no (S, S) tensor on the sdpa path."""

import copy

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from conftest import build_tiny
from llmattr.models.probe import Probe, eager_attention, repeat_heads


def _eager_twin(lm):
    """The same weights under transformers' own eager attention (the computation before the sdpa probe)."""
    twin = type(lm.model)(copy.deepcopy(lm.model.config))
    twin.load_state_dict(lm.model.state_dict())
    twin.set_attn_implementation("eager")
    return twin.eval()


def _ids(lm, batch=2, length=12, seed=1):
    ids = torch.randint(3, len(lm.tokenizer), (batch, length), generator=torch.Generator().manual_seed(seed))
    return ids.to(lm.device)


def test_probed_logits_equal_eager_logits(tiny_lm):
    """Logits and the recorded rows' probabilities equal transformers' eager attention (Gemma3's window of 4
    over 12 tokens included), on the sdpa path and on the full eager path."""
    ids = _ids(tiny_lm)
    with torch.no_grad():
        eager = _eager_twin(tiny_lm)(ids, output_attentions=True)
        plain = tiny_lm.model(ids).logits
        rows = torch.tensor([3, 7, 11])
        with Probe(record=True, rows=rows) as probe:
            recorded = tiny_lm.model(ids).logits
        with eager_attention():
            reference = tiny_lm.model(ids, output_attentions=True)
    for logits in (plain, recorded, reference.logits):
        torch.testing.assert_close(logits, eager.logits, atol=1e-5, rtol=0)
    n_layers = tiny_lm.model.config.num_hidden_layers
    assert sorted(probe.layers) == list(range(n_layers))
    for layer in range(n_layers):
        rec = probe.layers[layer]
        heads = rec.q.shape[1]
        assert rec.probs.shape == (2, heads, 3, 12)
        torch.testing.assert_close(rec.probs, eager.attentions[layer][:, :, rows], atol=1e-6, rtol=0)
        torch.testing.assert_close(reference.attentions[layer], eager.attentions[layer], atol=1e-6, rtol=0)
        # visibility is the layer's own mask: causal, and the sliding window where the layer has one
        assert torch.equal(rec.visible, eager.attentions[layer][:, 0, rows] > 0)


def test_recorded_output_is_probs_times_values(tiny_lm):
    ids = _ids(tiny_lm, batch=1, length=10)
    with torch.no_grad(), Probe(record=True) as probe:
        tiny_lm.model(ids)
    rec = probe.layers[1]
    assert rec.probs.shape[2] == 10  # rows=None: every query row
    torch.testing.assert_close(rec.out, (rec.probs @ rec.values()).transpose(1, 2), atol=1e-6, rtol=0)


def test_record_keeps_only_the_asked_fields_and_layers(tiny_llama):
    with torch.no_grad(), Probe(record=("probs",), rows=torch.tensor([9]), layers=[1]) as probe:
        tiny_llama.model(_ids(tiny_llama, batch=1, length=10))
    assert list(probe.layers) == [1]
    rec = probe.layers[1]
    assert rec.q is None and rec.k is None and rec.v is None and rec.out is None
    assert rec.probs.shape == (1, 4, 1, 10)


def test_replay_mixes_current_values_with_clean_probabilities(tiny_tokenizer):
    """Fixed routing: each layer's output = clean eager probabilities @ the perturbed pass's own values."""
    lm = build_tiny("llama", tiny_tokenizer)
    ids = torch.arange(3, 13)[None]
    embeds = lm.embed(ids)
    with torch.no_grad():
        clean_probs = _eager_twin(lm)(inputs_embeds=embeds, output_attentions=True).attentions
        with Probe(record=("q", "k")) as clean:
            lm.model(inputs_embeds=embeds)
        with Probe(record=True, replay=clean.layers) as fixed:
            fixed_logits = lm.model(inputs_embeds=embeds * 0.3).logits
        with eager_attention(), Probe(replay=clean.layers):
            eager_fixed = lm.model(inputs_embeds=embeds * 0.3).logits
        with Probe(record=True) as dynamic:
            lm.model(inputs_embeds=embeds * 0.3)
    torch.testing.assert_close(fixed_logits, eager_fixed, atol=1e-5, rtol=0)
    for i, probs in enumerate(clean_probs):
        rec = fixed.layers[i]
        torch.testing.assert_close(rec.out, (probs @ rec.values()).transpose(1, 2), atol=1e-6, rtol=0)
    assert not torch.allclose(dynamic.layers[1].probs, clean_probs[1])


def test_value_scale_zeroes_one_token(tiny_tokenizer):
    lm = build_tiny("qwen2", tiny_tokenizer)
    ids = torch.arange(3, 11, device=lm.device)[None].repeat(2, 1)
    scale = torch.ones(2, 8)
    scale[1, 4] = 0
    with Probe(record=True, value_scale=scale, value_layers={0}) as probe:
        lm.model(ids)
    assert torch.all(probe.layers[0].v[1, :, 4] == 0)
    assert torch.all(probe.layers[1].v[1, :, 4] != 0)
    assert torch.all(probe.layers[0].v[0, :, 4] != 0)


def test_repeat_heads_groups_adjacent_query_heads():
    kv = torch.arange(2.0)[None, :, None, None]  # two kv heads
    assert repeat_heads(kv, 4)[0, :, 0, 0].tolist() == [0.0, 0.0, 1.0, 1.0]


class LargestTensor(TorchDispatchMode):
    """Watches every tensor an operator creates and keeps the largest element count."""

    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.numel())
        return out


@pytest.mark.parametrize("routing", ["dynamic", "fixed"])
def test_no_tensor_grows_with_the_square_of_the_length(tiny_tokenizer, routing):
    """At 200 tokens, recording the explained rows and replaying the clean routing over a prefix cache
    create nothing of S x S elements (one head's attention matrix would be 40,000; 30 rows x 4 heads are 24,000)."""
    from llmattr.models.forward import logits_and_prefix

    lm = build_tiny("llama", tiny_tokenizer, max_position_embeddings=512)
    ids = _ids(lm, batch=1, length=200)
    length = ids.shape[1]
    rows = torch.arange(170, length)
    with torch.no_grad(), LargestTensor() as watch:
        with Probe(record=("q", "k") if routing == "fixed" else ("probs",), rows=rows) as clean:
            _, prefix = logits_and_prefix(lm, lm.embed(ids), torch.tensor([length - 1]), 170)
        with Probe(replay=clean.layers if routing == "fixed" else None):
            prefix.logits_at(lm, lm.embed(ids[:, 170:]).expand(3, -1, -1), torch.tensor([length - 1]))
    assert watch.largest < length * length
