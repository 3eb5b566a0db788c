"""Source-level estimators (llmattr.methods.source_estimators): leave-one-out with the prefix cache against a full
recompute and against prompts rebuilt without the source, ContextCite against the context-cite package on the same
model and masks, AttriBoT's hierarchy against flat leave-one-out."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from conftest import ARCHS, build_tiny
from llmattr import objectives
from llmattr.errors import LlmattrError
from llmattr.methods import source_ablation as ablation
from llmattr.methods.source_ablation import Ablation, ablated_objective, contextcite_masks, rows_per_pass
from llmattr.methods.source_estimators import ContextCite, HierarchicalLeaveOneOut, LeaveOneOut
from llmattr.models.memory import TOKEN_BUDGET
from sources_prompts import TEMPLATE, context_prompt, forced

DOCUMENTS = [" The movie was dull.", " An engrossing film, never boring.", " The plot made no sense at all.",
             " A terrific cast.", " The quick brown fox jumps over the lazy dog."]
SENTENCES = [[" The movie was dull.", " The plot made no sense."], [" An engrossing film.", " A terrific cast."],
             [" The quick brown fox.", " It jumps over the lazy dog.", " Never boring."]]
QUERY = "Was it good?"


def answer_ids(tokenizer) -> list[int]:
    return tokenizer("Positive film", add_special_tokens=False)["input_ids"]


def log_probs(lm, prompt, answer: list[int]) -> torch.Tensor:
    """log p(y_t) of each answer token after ``prompt``: one plain forward of prompt + answer."""
    ids = torch.cat([prompt.input_ids[0], torch.tensor(answer[:-1])])[None].to(lm.device)
    with torch.no_grad():
        logits = lm.model(input_ids=ids).logits[0, -len(answer):].float()
    return torch.log_softmax(logits, -1)[torch.arange(len(answer)), answer].cpu()


@pytest.mark.parametrize("arch", ARCHS)
def test_leave_one_out_is_the_drop_without_the_source(arch, tiny_tokenizer):
    """s_i = log p(y | context) - log p(y | context without document i), the second from the prompt rebuilt
    without document i's text; the cached and the naive mode agree with it. (Gemma-3's tiny window of 4 would
    hide every document from the answer; at 128 the batches still keep to one length per batch.)"""
    lm = build_tiny(arch, tiny_tokenizer, **({"sliding_window": 128} if arch == "gemma3" else {}))
    answer = answer_ids(tiny_tokenizer)
    target = forced(context_prompt(tiny_tokenizer, DOCUMENTS, QUERY), answer)
    clean = log_probs(lm, target.prompt, answer)
    expected = torch.stack([clean - log_probs(lm, context_prompt(tiny_tokenizer, DOCUMENTS[:i] + DOCUMENTS[i + 1:],
                                                                 QUERY), answer)
                            for i in range(len(DOCUMENTS))], 1)
    assert expected.abs().min() > 1e-4  # every document moves the answer: the check is not vacuous
    for params in ({}, {"batch_size": 2}, {"prefix": "none", "batch_size": 1}, {"prefix": "none"}):
        got = LeaveOneOut(**params).scores(lm, target)
        assert got.shape == (len(answer), len(DOCUMENTS))
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


def test_the_cache_runs_only_what_follows_each_removed_source(tiny_tokenizer, monkeypatch):
    """With the cache, the batch holding source i's row starts at source i's first token: the model sees fewer
    input tokens in all than with the full recompute."""
    lm = build_tiny("llama", tiny_tokenizer)
    target = forced(context_prompt(tiny_tokenizer, DOCUMENTS, QUERY), answer_ids(tiny_tokenizer))
    seen = []
    forward = lm.model.forward

    def counting(*args, **kwargs):
        seen.append(kwargs["input_ids"].numel())
        return forward(*args, **kwargs)

    monkeypatch.setattr(lm.model, "forward", counting)
    LeaveOneOut(batch_size=1).attribute(lm, target)
    cached, seen[:] = sum(seen), []
    LeaveOneOut(batch_size=1, prefix="none").attribute(lm, target)
    length = target.input_ids.shape[1]
    starts = [g[0] for g in target.prompt.sources.groups]
    sizes = [len(g) for g in target.prompt.sources.groups]
    assert sum(seen) == (len(DOCUMENTS) + 1) * length - sum(sizes)
    assert cached == length + sum(length - s - n for s, n in zip(starts, sizes, strict=True))
    seen[:] = []
    lm.forget()  # the rows of the first call are kept on the model under the same rule: run them again
    LeaveOneOut().attribute(lm, target)  # batch_size "auto": one row per pass on a CPU, the full reuse
    assert sum(seen) == cached


def test_auto_batch_is_one_row_on_a_cpu_and_the_token_budget_on_an_accelerator(tiny_tokenizer, monkeypatch):
    lm = build_tiny("llama", tiny_tokenizer)
    assert rows_per_pass(lm, "auto", 500) == 1 and rows_per_pass(lm, 4, 500) == 4
    monkeypatch.setattr(ablation, "forward_batch", lambda lm, tokens: TOKEN_BUDGET // tokens)
    assert rows_per_pass(SimpleNamespace(device=torch.device("cuda")), "auto", 500) == TOKEN_BUDGET // 500
    with pytest.raises(LlmattrError, match="batch_size must be a whole number >= 1"):
        ContextCite(batch_size="many")


def test_source_methods_refuse_a_prompt_without_sources(tiny_tokenizer):
    lm = build_tiny("llama", tiny_tokenizer)
    target = forced(context_prompt(tiny_tokenizer, DOCUMENTS, QUERY), answer_ids(tiny_tokenizer))
    bare = forced(type(target.prompt)(**{**target.prompt.__dict__, "sources": None}), answer_ids(tiny_tokenizer))
    for method in (LeaveOneOut(), ContextCite(), HierarchicalLeaveOneOut()):
        with pytest.raises(LlmattrError, match="scores sources: the prompt has none"):
            method.attribute(lm, bare)
    with pytest.raises(LlmattrError, match="needs sentence sources inside documents"):
        HierarchicalLeaveOneOut().attribute(lm, target)
    with pytest.raises(LlmattrError, match="prefix must be one of"):
        LeaveOneOut(prefix="some")


def test_hierarchical_search_is_flat_leave_one_out_on_the_searched_documents(tiny_tokenizer):
    """Documents' LOO picks the top documents; their sentences get exactly the flat sentence LOO, the others 0;
    with every document searched it is the flat LOO."""
    lm = build_tiny("llama", tiny_tokenizer)
    target = forced(context_prompt(tiny_tokenizer, [], QUERY, sentences=SENTENCES), answer_ids(tiny_tokenizer))
    sources = target.prompt.sources
    flat = LeaveOneOut().scores(lm, target)
    documents = Ablation.of(target, sources.documents.groups, objectives.OBJECTIVES["log-prob"])
    n_docs = len(SENTENCES)
    keep = ~torch.eye(n_docs, dtype=torch.bool)
    drop = (ablated_objective(lm, documents, torch.ones(1, n_docs, dtype=torch.bool), 1, False)
            - ablated_objective(lm, documents, keep, 1, False)).sum(1)
    top = int(drop.argmax())
    got = HierarchicalLeaveOneOut(top_documents=1).scores(lm, target)
    inside = torch.tensor([p == top for p in sources.parents])
    torch.testing.assert_close(got[:, inside], flat[:, inside], atol=1e-5, rtol=1e-5)
    assert (got[:, ~inside] == 0).all() and (flat[:, ~inside] != 0).all()
    torch.testing.assert_close(HierarchicalLeaveOneOut(top_documents=n_docs).scores(lm, target), flat,
                               atol=1e-5, rtol=1e-5)


def test_contextcite_masks_are_the_packages_draws():
    masks = contextcite_masks(7, 64, 0.5)
    for seed in (0, 13, 63):
        expected = np.random.RandomState(seed).choice([False, True], size=7, p=[0.5, 0.5])
        assert masks[seed].tolist() == expected.tolist()
    assert 0.3 < masks.float().mean() < 0.7


def test_contextcite_equals_the_package(tiny_tokenizer, monkeypatch):
    """The context-cite package's ContextCiter on the same tiny model, sources and answer: the same 64 masks, the
    same ablated prompts token for token, and the same surrogate weights. The package fits in float32 and stops
    scikit-learn's coordinate descent at a duality gap of 1e-4 ||y||^2; ours runs in float64 to 1e-12, on
    log-probabilities that differ from the package's float32 ones by ~3e-6: the weights agree to 1e-4 of their
    largest magnitude (measured 8.8e-6 of 1.72: docs/sources.md)."""
    import nltk

    monkeypatch.setattr(nltk, "download", lambda *args, **kwargs: True)  # the package fetches a sentence
    # splitter at import; our partitioner (one source per document) never uses it
    from context_cite import ContextCiter
    from context_cite.context_partitioner import BaseContextPartitioner

    class Documents(BaseContextPartitioner):
        """The package's partitioner interface over our documents (concatenated, no separators)."""

        num_sources = len(DOCUMENTS)

        def split_context(self):
            pass

        def get_source(self, index):
            return DOCUMENTS[index]

        def get_context(self, mask=None):
            return "".join(d for d, k in zip(DOCUMENTS, [True] * len(DOCUMENTS) if mask is None else mask,
                                             strict=True) if k)

    # at initializer_range 0.02 no document moves the answer enough to survive the LASSO penalty (every weight 0);
    # seed 2's greedy answer decodes to text that tokenises back to the same 4 tokens, so the package attributes
    # exactly the answer we force
    lm = build_tiny("llama", tiny_tokenizer, seed=2, initializer_range=0.2)
    context = "".join(DOCUMENTS)
    citer = ContextCiter(lm.model, tiny_tokenizer, context, QUERY, partitioner=Documents(context),
                         prompt_template=TEMPLATE, generate_kwargs={"max_new_tokens": 4, "do_sample": False})
    theirs = citer.get_attributions(verbose=False)
    prompt = context_prompt(tiny_tokenizer, DOCUMENTS, QUERY)
    assert citer._get_prompt_ids() == prompt.input_ids[0].tolist()
    assert citer._indices_to_token_indices() == (0, len(citer._response_ids))
    target = forced(prompt, list(citer._response_ids))
    ours = ContextCite()
    masks = ours.masks(len(DOCUMENTS))
    assert np.array_equal(citer._masks, masks.numpy())
    ablation = Ablation.of(target, prompt.sources.groups, objectives.OBJECTIVES["log-prob"])
    for mask in masks:  # the package rebuilds each prompt from text; we delete the tokens
        kept = ablation.kept_tokens(mask[None])[0]
        assert citer._get_prompt_ids(mask=mask.numpy()) == target.prompt.input_ids[0][kept[:prompt.length]].tolist()
    weights, _ = ours.fit(lm, target)
    assert np.abs(theirs).max() > 0.05 and (theirs != 0).sum() >= 2  # the surrogate is not all zeros
    np.testing.assert_allclose(weights.numpy(), theirs, atol=1e-4 * np.abs(theirs).max(), rtol=0)
    print("max |ours - package| =", float(np.abs(weights.numpy() - theirs).max()), "of max |w| =",
          float(np.abs(theirs).max()))
