"""A new architecture's part names are declared in one place (llmattr.models.anatomy.register_parts) and every
method finds its parts through them: a toy architecture, a tiny Llama whose blocks, attention module, output
projection, final norm and LM head all have other names, explained by gradient, decomposition, LRP,
DeepLIFT and perturbation methods with the scores of the same weights under Llama's names, to the last bit."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from transformers.masking_utils import create_causal_mask
from transformers.modeling_outputs import BaseModelOutputWithPast, CausalLMOutputWithPast
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS, slice_logits_to_keep
from transformers.models.llama.modeling_llama import (
    LlamaAttention,
    LlamaDecoderLayer,
    LlamaModel,
    LlamaPreTrainedModel,
    LlamaRMSNorm,
    apply_rotary_pos_emb,
)
from transformers.utils.deprecation import deprecate_kwarg

from conftest import build_tiny
from llmattr import methods
from llmattr.api import prepare
from llmattr.errors import LlmattrError
from llmattr.methods.lrp import relevance_rules
from llmattr.methods.value_zeroing import BlockTap
from llmattr.models import anatomy
from llmattr.models.intercept import innermost, intercepted
from llmattr.models.loading import wrap_model
from llmattr.models.memory import checkpointed
from llmattr.models.probe import Probe, eager_attention
from llmattr.request import Request

TEXT = "the quick brown fox jumps over the lazy dog"

# The toy architecture's one declaration: everything llmattr reads by name.
anatomy.register_parts("ToyForCausalLM", blocks="model.blocks", attention="mixer", out_proj="proj",
                       final_norm="model.ln_out", head="unembed")

RENAMED = (("model.layers.", "model.blocks."), (".self_attn.", ".mixer."), (".o_proj.", ".proj."),
           ("model.norm.", "model.ln_out."), ("lm_head.", "unembed."))


class ToyAttention(LlamaAttention):
    """Llama's attention with its output projection named ``proj``."""

    def __init__(self, config, layer_idx: int):
        super().__init__(config, layer_idx)
        self.proj = self._modules.pop("o_proj")

    def forward(self, hidden_states, position_embeddings, attention_mask, cache=None, **kwargs):
        shape = (*hidden_states.shape[:-1], -1, self.head_dim)
        q, k, v = (p(hidden_states).view(shape).transpose(1, 2) for p in (self.q_proj, self.k_proj, self.v_proj))
        q, k = apply_rotary_pos_emb(q, k, *position_embeddings)
        if cache is not None:
            k, v = cache.update(k, v, self.layer_idx, kwargs=kwargs)
        attention = ALL_ATTENTION_FUNCTIONS[self.config._attn_implementation]
        out, weights = attention(self, q, k, v, attention_mask, dropout=0.0, scaling=self.scaling, **kwargs)
        return self.proj(out.reshape(*hidden_states.shape[:-1], -1).contiguous()), weights


class ToyBlock(LlamaDecoderLayer):
    """Llama's block with its attention named ``mixer``."""

    def __init__(self, config, layer_idx: int):
        super().__init__(config, layer_idx)
        del self.self_attn
        self.mixer = ToyAttention(config, layer_idx)

    def forward(self, hidden_states, attention_mask=None, position_embeddings=None, cache=None, **kwargs):
        residual = hidden_states
        hidden_states, _ = self.mixer(self.input_layernorm(hidden_states), position_embeddings, attention_mask,
                                      cache, **kwargs)
        hidden_states = residual + hidden_states
        return hidden_states + self.mlp(self.post_attention_layernorm(hidden_states))


class ToyModel(LlamaModel):
    """Llama's decoder with its blocks named ``blocks`` and its final norm ``ln_out``."""

    def __init__(self, config):
        super().__init__(config)
        del self.layers, self.norm
        self.blocks = nn.ModuleList(ToyBlock(config, k) for k in range(config.num_hidden_layers))
        self.ln_out = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    @deprecate_kwarg("past_key_values", "5.40.0", new_name="cache")
    def forward(self, input_ids=None, attention_mask=None, position_ids=None, cache=None, inputs_embeds=None,
                use_cache=None, **kwargs):
        hidden = self.embed_tokens(input_ids) if inputs_embeds is None else inputs_embeds
        if position_ids is None:
            start = cache.get_seq_length() if cache is not None else 0
            position_ids = (torch.arange(hidden.shape[1], device=hidden.device) + start)[None]
        mask = create_causal_mask(config=self.config, inputs_embeds=hidden, attention_mask=attention_mask,
                                  cache=cache, position_ids=position_ids)
        rotary = self.rotary_emb(hidden, position_ids=position_ids)
        for block in self.blocks:
            hidden = block(hidden, attention_mask=mask, position_embeddings=rotary, cache=cache, **kwargs)
        return BaseModelOutputWithPast(last_hidden_state=self.ln_out(hidden), cache=cache)


class ToyForCausalLM(LlamaPreTrainedModel):
    """The toy causal LM: :class:`ToyModel` and an LM head named ``unembed`` (no ``lm_head``)."""

    def __init__(self, config):
        super().__init__(config)
        self.model = ToyModel(config)
        self.unembed = nn.Linear(config.hidden_size, config.vocab_size, bias=False)

    @deprecate_kwarg("past_key_values", "5.40.0", new_name="cache")
    def forward(self, input_ids=None, attention_mask=None, position_ids=None, cache=None, inputs_embeds=None,
                use_cache=None, logits_to_keep=0, **kwargs):
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, cache=cache,
                         inputs_embeds=inputs_embeds, use_cache=use_cache, **kwargs)
        logits = self.unembed(slice_logits_to_keep(out.last_hidden_state, logits_to_keep))
        return CausalLMOutputWithPast(logits=logits, cache=out.cache)


def renamed(key: str) -> str:
    for old, new in RENAMED:
        key = key.replace(old, new)
    return key


@pytest.fixture(scope="module")
def twins(tiny_tokenizer):
    """The tiny Llama and the toy with the same weights (the toy's state dict is Llama's, renamed)."""
    llama = build_tiny("llama", tiny_tokenizer)
    toy = ToyForCausalLM(llama.model.config)
    toy.load_state_dict({renamed(k): v for k, v in llama.model.state_dict().items()}, strict=True)
    return llama, wrap_model(toy, tiny_tokenizer, model_id="tiny-toy")


def test_without_its_names_the_toy_has_no_parts(twins, monkeypatch):
    """Unregistered, the toy's parts are not where transformers' architectures keep theirs: the methods that read
    them refuse it in one line that says where the names go."""
    _, toy = twins
    monkeypatch.delitem(anatomy.REGISTERED, "ToyForCausalLM")
    assert "lm_head" not in dict(toy.model.named_children()) and anatomy.output_head(toy.model) is None
    assert anatomy.final_norm(toy.model) is None
    with pytest.raises(LlmattrError, match=r"cannot find the 2 transformer blocks .*register_parts"):
        anatomy.decoder_blocks(toy.model)
    with pytest.raises(LlmattrError, match=r"cannot find the attention of ToyBlock .*register_parts\('ToyForCausalLM'"):
        anatomy.attention_parts(toy.model, toy.model.model.blocks[0])


def test_the_registered_names_lead_to_the_parts(twins):
    llama, toy = twins
    blocks = anatomy.decoder_blocks(toy.model)
    assert blocks is toy.model.model.blocks
    assert anatomy.attention_parts(toy.model, blocks[1]) == (blocks[1].mixer.proj, None)
    assert anatomy.final_norm(toy.model) is toy.model.model.ln_out
    assert anatomy.output_head(toy.model) is toy.model.unembed
    assert anatomy.parts_of(llama.model) is anatomy.DEFAULT  # Llama keeps transformers' names


METHODS = ("saliency", "grad-ellm", "alti", "globenc", "alti-logit", "attnlrp", "cp-lrp", "logat", "deeplift",
           "value-zeroing")


@pytest.mark.parametrize("name", METHODS)
def test_every_method_explains_the_toy_as_it_explains_llama(twins, name):
    """The toy's scores are Llama's, to the last bit, for a gradient method, Grad-ELLM (the probe), the
    decompositions (blocks, attention, output projection, final norm, head), AttnLRP and CP-LRP (rules), the
    head-on-top, DeepLIFT and value zeroing (patched blocks)."""
    llama, toy = twins
    scores = []
    for lm in (llama, toy):
        target = prepare(lm, TEXT, Request("generate", answer=" the fox"))
        scores.append(methods.get(name).attribute(lm, target))
    assert torch.equal(scores[0], scores[1])


@pytest.mark.parametrize("name", ["saliency", "attnlrp", "deeplift"])
def test_checkpointed_methods_find_the_toys_blocks(twins, name):
    """Activation checkpointing (and DeepLIFT's blockwise passes) patch the blocks the registration names: the
    same scores as Llama's, checkpointed or not."""
    llama, toy = twins
    scores = []
    for lm in (llama, toy):
        method = methods.get(name)
        target = prepare(lm, TEXT, Request("generate", answer=" the fox"))
        with method.checkpointing(lm, True):
            scores.append(method.attribute(lm, target))
    assert torch.equal(scores[0], scores[1])


def test_a_registration_is_checked():
    """A role that does not exist, or other names under a registered class, is one line."""
    with pytest.raises(LlmattrError, match="unknown part role"):
        anatomy.register_parts("Other", heads="x")
    with pytest.raises(LlmattrError, match="already registered"):
        anatomy.register_parts("ToyForCausalLM", head="lm_out")


def test_one_stack_says_whether_a_forward_is_intercepted(twins):
    """Probes, eager attention and patched forwards that record or change a pass make ``intercepted()`` true (the
    kept caches stand aside); checkpointing and the LRP rules, transparent to passes without gradients, do not."""
    _, toy = twins
    assert not intercepted()
    with checkpointed(toy, True), relevance_rules(toy.model):
        assert not intercepted()
        with Probe(record=("q",)) as probe:
            assert intercepted() and innermost(Probe) is probe
        with eager_attention():
            assert intercepted()
        with BlockTap(anatomy.decoder_blocks(toy.model), [0], torch.tensor([1])):
            assert intercepted()
        assert not intercepted() and innermost(Probe) is None
