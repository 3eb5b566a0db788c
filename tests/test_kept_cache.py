"""Results kept on a loaded model (``lm.kept``, models/kept.py): an edit of the weights in place never serves a
stale entry (every method that reads one gives the scores and deltas of a freshly built model with the edited
weights, to the last bit), ``forget()`` drops them (needed after an edit through ``.data``, and called by
``finetune``), one byte budget and one LRU eviction over every kind of entry, and nothing kept or read under a
probe or eager attention."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

import llmattr
from conftest import build_tiny, token_methods
from llmattr import methods
from llmattr.models.kept import Kept, weights_version
from llmattr.models.probe import Probe, eager_attention
from test_finetune import toy_file, toy_finetune

TEXT = "An engrossing film that is never boring, with a terrific cast."
PATH = ("gradient-shap", "igcg", "integrated-gradients")
KEEPING = ("attnlrp", "cp-lrp", "deeplift-ixg", "input-x-gradient", "saliency", *PATH)  # the methods reading an entry
FORCED = {"task": "generate", "answer": " a fine film"}  # a forced answer: F(x) runs through the template's cache


def explain(lm, name: str, **options) -> llmattr.Explanation:
    fast = {"n_steps": 4} if "n_steps" in methods.REGISTRY[name].defaults else {}
    settings = {"task": "sentiment", **options}
    return llmattr.explain(TEXT, model=lm, method=name, progress=False, **fast, **settings)


def numbers(expl: llmattr.Explanation) -> tuple[torch.Tensor, list]:
    """The raw scores and each step's target and convergence deltas."""
    return expl.score_matrix(raw=True), [(s.target_delta, s.convergence_delta) for s in expl.steps]


def assert_bit_equal(got: llmattr.Explanation, want: llmattr.Explanation) -> None:
    (got_raw, got_deltas), (want_raw, want_deltas) = numbers(got), numbers(want)
    assert got.generated == want.generated and torch.equal(got_raw, want_raw) and got_deltas == want_deltas


def scale_block0(lm, factor: float = 1.7, through_data: bool = False) -> None:
    """Multiply the tiny Llama's first block's weights by ``factor`` in place (an ablation or steering edit)."""
    with torch.no_grad():
        for p in lm.model.model.layers[0].parameters():
            (p.data if through_data else p).mul_(factor)


def edited_fresh(tiny_tokenizer, through_data: bool = False):
    lm = build_tiny("llama", tiny_tokenizer)
    scale_block0(lm, through_data=through_data)
    return lm


@pytest.mark.parametrize("name, options", [(name, {}) for name in KEEPING] + [(name, FORCED) for name in PATH])
def test_an_in_place_edit_of_the_weights_serves_no_stale_entry(tiny_tokenizer, name, options):
    """Explain, edit block 0's weights in place, explain again on the same model: the scores and deltas of a model
    built fresh with the same edited weights, to the last bit (before issue 39 the old weights' entries were served:
    scores 9% to 138% of the largest score off, convergence deltas 13% to 530%)."""
    lm = build_tiny("llama", tiny_tokenizer)
    before = explain(lm, name, **options)
    scale_block0(lm)
    assert_bit_equal(explain(lm, name, **options), explain(edited_fresh(tiny_tokenizer), name, **options))
    assert not torch.equal(numbers(before)[0], numbers(explain(lm, name, **options))[0])  # the edit shows


def test_the_methods_that_keep_entries_are_those_tested(tiny_tokenizer):
    """Every registered method that leaves an entry in the store is in KEEPING (so the stale-entry test covers it)."""
    keeping = []
    for name in token_methods():
        lm = build_tiny("llama", tiny_tokenizer)
        explain(lm, name)
        if len(lm.kept):
            keeping.append(name)
    assert keeping == sorted(KEEPING)


def test_an_edit_through_data_needs_forget(tiny_tokenizer):
    """``p.data.mul_`` bumps no version counter, so the store cannot see it (the documented limitation):
    ``lm.forget()`` drops every entry and the next call computes them from the edited weights."""
    lm = build_tiny("llama", tiny_tokenizer)
    explain(lm, "integrated-gradients")
    version, kept = weights_version(lm.model), dict(lm.kept.entries)
    scale_block0(lm, through_data=True)
    assert weights_version(lm.model) == version and lm.kept.entries == kept  # unseen: the entries would be served
    assert not len(replace(lm, model=lm.model).kept)  # another LoadedModel starts with an empty store
    lm.forget()
    assert not len(lm.kept) and lm.kept.nbytes == 0
    fresh = edited_fresh(tiny_tokenizer, through_data=True)
    assert_bit_equal(explain(lm, "integrated-gradients"), explain(fresh, "integrated-gradients"))


def test_in_place_edits_change_the_version(tiny_tokenizer):
    """An in-place operation under no_grad, an optimizer's step, load_state_dict and ``p.data = t`` each change the
    weights' version; a forward does not."""
    lm = build_tiny("llama", tiny_tokenizer)
    versions = [weights_version(lm.model)]
    with torch.no_grad():
        lm.model(input_ids=torch.tensor([[1, 2, 3]], device=lm.device))
    assert weights_version(lm.model) == versions[0]
    param = lm.model.model.layers[1].mlp.up_proj.weight
    with torch.no_grad():
        param.add_(1)
    versions.append(weights_version(lm.model))
    param.requires_grad_(True)
    param.grad = torch.ones_like(param)
    torch.optim.SGD([param], lr=0.1).step()
    versions.append(weights_version(lm.model))
    lm.model.load_state_dict(build_tiny("llama", tiny_tokenizer).model.state_dict())
    versions.append(weights_version(lm.model))
    param.data = param.data.clone()
    versions.append(weights_version(lm.model))
    assert len(set(versions)) == len(versions)


def entry(nbytes: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """A kept value of ``nbytes`` bytes: one layer's keys and values."""
    half = torch.zeros(nbytes // 2, dtype=torch.uint8)
    return [(half, half.clone())]


def test_one_byte_budget_and_one_lru_eviction_over_every_kind(tiny_llama):
    """Entries of every kind share one budget; the least recently used goes first, whatever its kind; an entry over
    the budget alone is computed and returned, not kept; a change of the weights' version drops them all."""
    model, store = tiny_llama.model, Kept(budget=100)
    store.keep(model, ("prefix-cache", 1), entry(40))
    store.keep(model, ("path-prefix", 1), entry(40))
    assert store.get(model, ("prefix-cache", 1)) is not None  # now the most recently used
    made = store.fetch(model, ("zero-prefix", 1), lambda: entry(40))
    assert list(store.entries) == [("prefix-cache", 1), ("zero-prefix", 1)] and store.nbytes == 80
    assert store.get(model, ("path-prefix", 1)) is None and store.get(model, ("zero-prefix", 1)) is made
    big = store.fetch(model, ("path-prefix", 2), lambda: entry(102))
    assert len(big[0][0]) == 51 and ("path-prefix", 2) not in store.entries and len(store) == 2
    store.keep(model, ("zero-prefix", 1), entry(70))  # replacing an entry frees its bytes first
    assert list(store.entries) == [("zero-prefix", 1)] and store.nbytes == 70
    with torch.no_grad():
        model.model.norm.weight.mul_(2)
    assert store.get(model, ("zero-prefix", 1)) is None and not len(store)


def test_nothing_is_kept_or_read_under_a_probe_or_eager_attention(tiny_tokenizer):
    """While a probe or eager attention is in force a method computes every result and the store neither serves
    nor keeps one."""
    lm = build_tiny("llama", tiny_tokenizer)
    for intercept in (lambda: Probe(record=("q",)), eager_attention):
        for name in ("saliency", "integrated-gradients"):
            lm.forget()
            with intercept():
                explain(lm, name)
            assert not len(lm.kept)
        explain(lm, "integrated-gradients")
        kept = dict(lm.kept.entries)
        assert kept
        key, made = next(iter(kept)), entry(2)
        with intercept():
            assert lm.kept.get(lm.model, key) is None
            assert lm.kept.fetch(lm.model, key, lambda made=made: made) is made  # computed, not read
            lm.kept.keep(lm.model, ("other", 1), made)
        assert lm.kept.entries == kept


def test_finetune_on_a_loaded_model_leaves_no_stale_entry(tiny_tokenizer, tmp_path):
    """``finetune`` trains a loaded model in place (a LoRA merge writes through ``.data``, which no version counter
    sees) and forgets its kept entries: the next explanation is that of a fresh model with the trained weights."""
    lm = build_tiny("llama", tiny_tokenizer)
    explain(lm, "integrated-gradients")
    assert len(lm.kept)
    toy_finetune(lm, tmp_path / "ft", toy_file(tmp_path / "toy.jsonl", n=30), lora_r=4, epochs=1, held_out=10)
    assert not len(lm.kept)
    fresh = build_tiny("llama", tiny_tokenizer)
    fresh.model.load_state_dict(lm.model.state_dict())
    assert_bit_equal(explain(lm, "integrated-gradients"), explain(fresh, "integrated-gradients"))


def test_rows_computes_each_distinct_row_once_across_calls(tiny_llama):
    """``Kept.rows``: identical rows of a batch run once, a row kept by an earlier call of the same key is read
    back (only the others are computed, together), another key or an edit of the weights computes again."""
    model, store, calls = tiny_llama.model, Kept(), []

    def compute(rows: torch.Tensor) -> torch.Tensor:
        calls.append(rows.tolist())
        return rows @ torch.tensor([[1.0, 10.0], [100.0, 1000.0]])

    first = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 0.0]])
    assert store.rows(model, "masks", first, compute).tolist() == [[1, 10], [100, 1000], [1, 10]]
    assert calls == [[[0.0, 1.0], [1.0, 0.0]]]
    second = torch.tensor([[1.0, 1.0], [0.0, 1.0]])
    assert store.rows(model, "masks", second, compute).tolist() == [[101, 1010], [100, 1000]]
    assert calls[1:] == [[[1.0, 1.0]]]  # the row kept by the first call is read back
    store.rows(model, "other", second, compute)
    assert calls[2:] == [[[0.0, 1.0], [1.0, 1.0]]]
    with torch.no_grad():
        model.model.norm.weight.mul_(2)
    store.rows(model, "masks", second, compute)
    assert calls[3:] == [[[0.0, 1.0], [1.0, 1.0]]]
    assert store.rows(model, "masks", first[:0], compute).shape == (0, 2)
