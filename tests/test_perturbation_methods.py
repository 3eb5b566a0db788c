"""Value Zeroing, ReAGent, LIME and the random baseline: formulas, batching, the real model (slow)."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from conftest import ARCHS, build_tiny
from llmattr import methods
from llmattr.api import explain, prepare
from llmattr.errors import LlmattrError
from llmattr.methods.lime import WeightedRidge, span_forward
from llmattr.methods.value_zeroing import BlockTap
from llmattr.models.anatomy import decoder_blocks
from llmattr.models.loading import LoadedModel
from llmattr.models.probe import Probe, eager_attention
from llmattr.prompting import build_prompt
from llmattr.request import Request
from llmattr.targets import Target
from llmattr.tasks import get_task

TEXT = "An engrossing film that is never boring."


def gen_target(lm, answer=" the quick fox"):
    return prepare(lm, TEXT, Request("generate", answer=answer))


class ForwardCounter:
    """Count forward calls of a model and the rows each one carried."""

    def __init__(self, model):
        self.rows: list[int] = []
        self.lengths: list[int] = []
        self.handle = model.register_forward_pre_hook(self.hook, with_kwargs=True)

    def hook(self, module, args, kwargs):
        x = kwargs.get("inputs_embeds", kwargs.get("input_ids"))
        self.rows.append(int(x.shape[0]))
        self.lengths.append(int(x.shape[1]))

    def close(self):
        self.handle.remove()


# --- value zeroing ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("layers", ["last", "all"])
def test_value_zeroing_of_an_ignored_token_is_zero(tiny_tokenizer, layers):
    """One layer; a token whose embedding is 0 has value vector 0 (RMSNorm(0) = 0, no bias): score 0."""
    lm = build_tiny("llama", tiny_tokenizer, num_hidden_layers=1)
    target = gen_target(lm)
    a, b = target.span
    ignored = int(target.input_ids[0, a + 2])
    lm.model.get_input_embeddings().weight.data[ignored] = 0.0
    raw = methods.get("value-zeroing", layers=layers).attribute(lm, target)
    is_ignored = target.input_ids[0, a:b] == ignored
    assert raw.shape == (target.n_steps, b - a)
    assert torch.all(raw[:, is_ignored] == 0)
    assert torch.all(raw[:, ~is_ignored] > 0)


def reference_value_zeroing(lm, target, layers):
    """One forward per (token, layer), zeroing only that layer: Inseq's definition, unbatched."""
    a, b = target.span
    blocks = decoder_blocks(lm.model)
    pos, ids = target.positions, target.input_ids.to(lm.device)
    with torch.no_grad(), BlockTap(blocks, layers, pos) as tap:
        lm.model(ids)
    clean = dict(tap.outputs)
    dist = torch.zeros(len(layers), target.n_steps, b - a)
    for li, layer in enumerate(layers):
        for j in range(a, b):
            scale = torch.ones(1, target.input_ids.shape[1])
            scale[0, j] = 0
            with torch.no_grad(), BlockTap(blocks, [layer], pos) as tap, \
                    Probe(value_scale=scale, value_layers={layer}):
                lm.model(ids)
            cos = torch.nn.functional.cosine_similarity(tap.outputs[layer][0], clean[layer][0], dim=-1)
            dist[li, :, j - a] = 1 - cos
    dist = torch.where(dist > 1e-6, dist, torch.zeros_like(dist))
    total = dist.sum(-1, keepdim=True)  # 0 where a sliding window hides every content token from the step
    return torch.where(total > 0, dist / total, dist).mean(0)


@pytest.mark.parametrize("arch", ARCHS)
def test_value_zeroing_batched_matches_one_forward_per_token_and_layer(tiny_tokenizer, arch):
    """Batching, prefix cache and replayed blocks change nothing (both under the same eager attention: the
    distances are ~1e-5, so normalising them magnifies kernel-order noise; sdpa = eager is in test_long_inputs)."""
    lm = build_tiny(arch, tiny_tokenizer, num_hidden_layers=3)
    target = gen_target(lm)
    with eager_attention():
        expected = reference_value_zeroing(lm, target, [0, 1, 2])
        got = methods.get("value-zeroing", layers="all", batch_size=5).attribute(lm, target)
        torch.testing.assert_close(got, expected, rtol=1e-3, atol=1e-5)
        torch.testing.assert_close(methods.get("value-zeroing", layers=1).attribute(lm, target),
                                   reference_value_zeroing(lm, target, [1]), rtol=1e-3, atol=1e-5)


@pytest.mark.parametrize("layers, rerun", [("last", {2}), (1, {1}), ("all", {0, 1, 2})])
def test_value_zeroing_runs_only_the_zeroed_blocks_again(tiny_tokenizer, layers, rerun):
    """Blocks before the first zeroed layer (same input in every row) and after the last (output unread) run
    once, in the clean pass; the zeroed rows run only the zeroed blocks."""
    lm = build_tiny("llama", tiny_tokenizer, num_hidden_layers=3)
    blocks = decoder_blocks(lm.model)
    calls = {k: 0 for k in range(3)}
    handles = [blocks[k].mlp.register_forward_pre_hook(lambda *_, k=k: calls.__setitem__(k, calls[k] + 1))
               for k in range(3)]  # a block's MLP runs when the block computes (a replayed block computes nothing)
    methods.get("value-zeroing", layers=layers, batch_size=4).attribute(lm, gen_target(lm))
    for handle in handles:
        handle.remove()
    assert {k for k, n in calls.items() if n > 1} == rerun and all(n >= 1 for n in calls.values())
    assert all("forward" not in vars(block) for block in blocks)  # restored


def test_value_zeroing_runs_few_forwards(tiny_llama):
    target = gen_target(tiny_llama)
    n = target.span[1] - target.span[0]
    counter = ForwardCounter(tiny_llama.model)
    methods.get("value-zeroing", layers="all", batch_size=8).attribute(tiny_llama, target)
    counter.close()
    assert len(counter.rows) == 1 + math.ceil(n / 8)
    assert sum(counter.rows) == 1 + n
    # zeroed rows start at the first explained position (the clean keys/values before it are cached)
    seq, first = target.input_ids.shape[1], int(target.positions.min())
    assert counter.lengths == [seq] + [seq - first] * (len(counter.rows) - 1)


# --- random ----------------------------------------------------------------------------------------------------


def test_random_is_seeded_and_reproducible(tiny_llama):
    target = gen_target(tiny_llama)
    first = methods.get("random", seed=3).attribute(tiny_llama, target)
    assert torch.equal(first, methods.get("random", seed=3).attribute(tiny_llama, target))
    assert not torch.equal(first, methods.get("random", seed=4).attribute(tiny_llama, target))
    assert first.shape == (target.n_steps, target.span[1] - target.span[0])
    assert first.min() >= 0 and first.max() < 1


# --- a toy model where only one content token matters ------------------------------------------------------------


class OneTokenLM(torch.nn.Module):
    """Logits at every position = 4 * E @ e(x_j): only the token at position j matters."""

    def __init__(self, vocab: int, j: int):
        super().__init__()
        torch.manual_seed(0)
        self.emb = torch.nn.Embedding(vocab, 16)
        self.j = j
        self.config = SimpleNamespace(num_hidden_layers=1, get_text_config=lambda: self.config)

    def get_input_embeddings(self):
        return self.emb

    def forward(self, inputs_embeds=None, logits_to_keep=1, use_cache=False, cache=None, input_ids=None,
                **kwargs):
        """A cached prefix of P tokens (stored as P dummy keys) shifts position j to j - P in the input; the cache
        comes as ``cache=``, transformers' name for it since 5.24 (``past_key_values`` before)."""
        if inputs_embeds is None:
            inputs_embeds = self.emb(input_ids)
        prefix = cache.get_seq_length() if cache is not None else 0
        if use_cache and cache is not None:
            dummy = inputs_embeds.new_zeros(inputs_embeds.shape[0], 1, inputs_embeds.shape[1], 1)
            cache.update(dummy, dummy, 0)
        if self.j < prefix + inputs_embeds.shape[1] and self.j >= prefix:
            logits = 4.0 * inputs_embeds[:, self.j - prefix] @ self.emb.weight.T
        else:  # the prefix pass, before position j
            logits = inputs_embeds.new_zeros(inputs_embeds.shape[0], self.emb.num_embeddings)
        if isinstance(logits_to_keep, int):
            logits_to_keep = range(logits_to_keep)
        return SimpleNamespace(logits=logits[:, None, :].expand(-1, len(logits_to_keep), -1))


def one_token_target(tokenizer, offset: int = 3):
    prompt = build_prompt(tokenizer, get_task("generate"), {"text": TEXT})
    j = prompt.span[0] + offset
    lm = LoadedModel(model=OneTokenLM(tokenizer.vocab_size, j), tokenizer=tokenizer, model_id="toy")
    with torch.no_grad():
        y = lm.model(lm.embed(prompt.input_ids), torch.tensor([0])).logits[0, 0].argmax()
    return lm, Target(prompt=prompt, target_ids=torch.stack([y, y])), offset


@pytest.mark.parametrize("sampler", ["causal", "uniform"])
def test_reagent_ranks_the_only_token_that_matters_first(tiny_tokenizer, sampler):
    """A probe stops once keeping its top ``keep_top_n`` tokens is sufficient: with 1 / top-1 the token must
    be first; with the paper's 3 / top-3 and uniform replacements it must be among the top 3 (the causal
    sampler draws near-synonyms of the token here, which can keep the target in the top 3)."""
    lm, target, j = one_token_target(tiny_tokenizer)
    strict = dict(keep_top_n=1, stopping_condition_top_k=1, sampler=sampler)
    raw = methods.get("reagent", **strict).attribute(lm, target)
    assert raw.shape == (2, target.span[1] - target.span[0])
    assert torch.all(raw.argmax(-1) == j)
    torch.testing.assert_close(raw.sum(-1), torch.ones(2))
    assert torch.equal(raw, methods.get("reagent", **strict).attribute(lm, target))
    paper = methods.get("reagent", sampler="uniform").attribute(lm, target)
    assert torch.all((paper.topk(3, dim=-1).indices == j).any(-1))


def test_reagent_batches_probes_as_rows(tiny_llama):
    target = gen_target(tiny_llama)
    counter = ForwardCounter(tiny_llama.model)
    methods.get("reagent", max_probe_steps=5, num_probes=2).attribute(tiny_llama, target)
    counter.close()
    # one clean forward (p(y|x), sampler, prefix cache) + at most max_probe_steps + 1 probe forwards
    assert len(counter.rows) <= 1 + 6
    assert max(counter.rows) <= 2 * target.n_steps * 2
    assert max(counter.rows) > 2
    a, n = target.span[0], target.input_ids.shape[1]
    assert counter.lengths[0] == n and set(counter.lengths[1:]) == {n - a}  # later rows start at the span


def test_reagent_mlm_sampler_with_a_shared_vocabulary(tiny_tokenizer):
    from transformers import BertConfig, BertForMaskedLM

    torch.manual_seed(0)
    mlm = BertForMaskedLM(BertConfig(vocab_size=tiny_tokenizer.vocab_size, hidden_size=16, num_hidden_layers=1,
                                     num_attention_heads=2, intermediate_size=32)).eval()
    lm, target, j = one_token_target(tiny_tokenizer)
    raw = methods.get("reagent", sampler="mlm", mlm_model=mlm, keep_top_n=1,
                      stopping_condition_top_k=1).attribute(lm, target)
    assert torch.all(raw.argmax(-1) == j)
    with pytest.raises(LlmattrError, match="mlm_model"):
        methods.get("reagent", sampler="mlm")
    with pytest.raises(LlmattrError, match="not available locally"):
        methods.get("reagent", mlm_model="/nonexistent/mlm").attribute(lm, target)


# --- LIME ------------------------------------------------------------------------------------------------------


def test_weighted_ridge_recovers_an_exact_linear_model():
    torch.manual_seed(0)
    z = torch.bernoulli(torch.full((40, 5), 0.5))
    beta = torch.tensor([1.0, -2.0, 0.5, 0.0, 3.0])
    y = z @ beta + 0.7
    w = torch.rand(40)
    model = WeightedRidge(alpha=0.0)
    model.fit([(z, y, w)])
    torch.testing.assert_close(model.representation()[0], beta, rtol=1e-4, atol=1e-4)


def test_lime_agrees_with_a_direct_captum_call(tiny_llama):
    """Same function, same seed, Captum unbatched and per step: our batched, step-sharing run agrees."""
    from captum.attr import Lime

    target = gen_target(tiny_llama)
    a, b = target.span
    span = tiny_llama.embed(target.input_ids)[:, a:b].detach()
    mask = torch.arange(b - a, device=span.device)[None, :, None].expand_as(span)
    forward = span_forward(tiny_llama, target)
    got = methods.get("lime", n_samples=30, batch_size=7, seed=5).attribute(tiny_llama, target)
    for t in range(target.n_steps):
        torch.manual_seed(5)
        direct = Lime(lambda x, t=t: forward(x)[:, t], interpretable_model=WeightedRidge(1.0)).attribute(
            span, baselines=0.0, feature_mask=mask, n_samples=30, perturbations_per_eval=1,
            return_input_shape=False)[0]
        torch.testing.assert_close(got[t], direct, rtol=1e-3, atol=1e-3 * float(direct.abs().max()))


def test_lime_shares_perturbations_across_steps(tiny_llama):
    target = gen_target(tiny_llama)
    counter = ForwardCounter(tiny_llama.model)
    methods.get("lime", n_samples=20, batch_size=8).attribute(tiny_llama, target)
    counter.close()
    a = target.span[0]
    assert counter.rows == [1, 8, 8, 4]  # the template prefix once, then the perturbations
    assert counter.lengths == [a] + [target.input_ids.shape[1] - a] * 3


def test_lime_finds_the_only_token_that_matters(tiny_tokenizer):
    lm, target, j = one_token_target(tiny_tokenizer)
    raw = methods.get("lime", n_samples=64).attribute(lm, target)
    assert torch.all(raw.argmax(-1) == j)


# --- the real model ----------------------------------------------------------------------------------------------

FAST = {"reagent": {"max_probe_steps": 1, "num_probes": 1}, "lime": {"n_samples": 8, "batch_size": 8}}
MINE = ("attention", "l2-norm", "logat", "normxlogit", "value-zeroing", "reagent", "lime", "random")


@pytest.mark.slow
def test_every_method_on_the_real_model(smollm):
    sentiment = prepare(smollm, "A gorgeous, witty film.", Request("sentiment"))
    generation = prepare(smollm, "The fox", Request("generate", max_new_tokens=10))
    for name in MINE:
        method = methods.get(name, **FAST.get(name, {}))
        for target in (sentiment, generation):
            raw = method.attribute(smollm, target)
            assert raw.shape == (target.n_steps, target.span[1] - target.span[0])
            assert torch.isfinite(raw).all(), name
    expl = explain("A gorgeous, witty film.", model=smollm, method="normxlogit")
    assert expl.method == "normxlogit" and len(expl.steps) >= 1
