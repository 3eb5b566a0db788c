"""Source-level faithfulness (llmattr.faithfulness.source_metrics): each metric against a hand computation on prompts
rebuilt without the removed documents, pi-Soft over sources against token-level pi-Soft."""

from __future__ import annotations

import math

import pytest
import torch
from scipy.stats import spearmanr

from conftest import build_tiny
from llmattr.faithfulness import engine as engine_module
from llmattr.faithfulness import registry
from llmattr.faithfulness.soft import evaluate_target
from llmattr.faithfulness.source_metrics import (
    HELD_OUT_SEED,
    SourceInput,
    gold_alignment,
    removal_metrics,
    source_soft,
    spearman,
)
from llmattr.methods.source_ablation import contextcite_masks
from llmattr.sources import Sources
from sources_prompts import context_prompt, forced
from test_source_estimators import DOCUMENTS, QUERY, answer_ids, log_probs


@pytest.fixture
def lm(tiny_tokenizer):
    return build_tiny("llama", tiny_tokenizer, initializer_range=0.2)  # documents move the answer


def test_source_removal_metrics_by_hand(lm, tiny_tokenizer):
    """top-k drop, comprehensiveness, sufficiency and LDS from prompts rebuilt with the documents left out."""
    answer = answer_ids(tiny_tokenizer)
    target = forced(context_prompt(tiny_tokenizer, DOCUMENTS, QUERY), answer)
    scores = torch.tensor([[0.1, 3.0, -1.0, 2.0, 0.5]])  # ranking: documents 1, 3, 4, 0, 2

    def log_p(kept: list[int]) -> float:
        prompt = context_prompt(tiny_tokenizer, [DOCUMENTS[i] for i in kept], QUERY)
        return float(log_probs(lm, prompt, answer).double().sum())

    full = log_p(list(range(5)))
    without = [log_p([0, 2, 3, 4]), log_p([0, 2, 4])]
    only = [log_p([1]), log_p([1, 3])]
    masks = contextcite_masks(5, 6, 0.5, HELD_OUT_SEED + 3)
    actual = [log_p([i for i in range(5) if m[i]]) for m in masks]
    logit = [a - math.log(-math.expm1(a)) for a in actual]
    rho = spearmanr((masks.double() @ scores[0].double()).numpy(), logit).statistic
    got = removal_metrics(lm, SourceInput(target, scores, True), k_max=2, lds_ablations=6, seed=3)
    assert got.top_k_drop == pytest.approx([full - w for w in without], abs=1e-4)
    assert got.comprehensiveness == pytest.approx(sum(math.exp(full) - math.exp(w) for w in without) / 2, abs=1e-6)
    assert got.sufficiency == pytest.approx(sum(math.exp(full) - math.exp(o) for o in only) / 2, abs=1e-6)
    assert got.lds == pytest.approx(rho, abs=1e-9)
    assert abs(got.top_k_drop[0]) > 1e-3 and not math.isnan(rho)  # not vacuous


def test_spearman_with_ties_is_scipys():
    a = torch.tensor([1.0, 2.0, 2.0, 5.0, 0.0, 2.0])
    b = torch.tensor([3.0, 1.0, 4.0, 4.0, 0.5, 9.0])
    assert spearman(a, b) == pytest.approx(spearmanr(a.numpy(), b.numpy()).statistic, abs=1e-12)
    assert math.isnan(spearman(torch.ones(4), b[:4]))


def test_gold_alignment_by_hand():
    # ranking 1, 3, 2, 0: gold {2} found at rank 3 -> AP 1/3, top-1 misses; gold {1, 2}: (1/1 + 2/3) / 2
    scores = torch.tensor([0.1, 0.9, 0.4, 0.5])
    assert gold_alignment(scores, (2,)) == pytest.approx((1 / 3, 0.0))
    assert gold_alignment(scores, (1, 2)) == pytest.approx(((1 + 2 / 3) / 2, 1.0))


def test_source_pi_soft_with_one_token_sources_is_token_pi_soft(lm, tiny_tokenizer):
    """Sources of one span token each: the same masks, the same pi-Soft curves as token-level pi-Soft."""
    target = forced(context_prompt(tiny_tokenizer, DOCUMENTS, QUERY), answer_ids(tiny_tokenizer))
    n = target.span[1] - target.span[0]
    singles = Sources(names=tuple(map(str, range(n))), groups=tuple((k,) for k in range(n)),
                      chars=((0, 0),) * n)
    target = forced(type(target.prompt)(**{**target.prompt.__dict__, "sources": singles}), answer_ids(tiny_tokenizer))
    raw = torch.rand(target.n_steps, n, generator=torch.Generator().manual_seed(0))
    kwargs = {"samples": 3, "seed": 5, "pis": (0.2, 0.5, 0.8)}
    ours = source_soft(lm, SourceInput(target, raw, False), [0, 1], **kwargs)
    token = evaluate_target(lm, target, (raw - raw.amin(1, keepdim=True)) / (raw.amax(1, keepdim=True)
                                                                            - raw.amin(1, keepdim=True)), [0, 1],
                            **kwargs)
    assert ours.pi_soft_ns == pytest.approx(token.pi_soft_ns, abs=1e-12)
    assert ours.pi_soft_nc == pytest.approx(token.pi_soft_nc, abs=1e-12)


def test_source_pi_soft_masks_each_sources_tokens_together(lm, tiny_tokenizer, monkeypatch):
    """Every perturbed input keeps or zeroes a source's tokens together, never touches a token of no source,
    and the zero baseline zeroes every source."""
    target = forced(context_prompt(tiny_tokenizer, DOCUMENTS, QUERY), answer_ids(tiny_tokenizer))
    seen = []
    probs = engine_module.PerturbationEngine.probs

    def recording(self, keep, **options):
        seen.append(keep.clone())
        return probs(self, keep, **options)

    monkeypatch.setattr(engine_module.PerturbationEngine, "probs", recording)
    scores = torch.tensor([[0.1, 3.0, -1.0, 2.0, 0.5]])
    result = source_soft(lm, SourceInput(target, scores, True), [0], samples=4, pis=(0.3, 0.7))
    keep = torch.cat(seen)
    groups = target.prompt.sources.groups
    outside = sorted(set(range(keep.shape[1])) - {k for g in groups for k in g})
    assert (keep[:, outside] == 1).all()
    for group in groups:
        assert (keep[:, list(group)] == keep[:, [group[0]]]).all()
    assert (keep[0, [k for g in groups for k in g]] == 0).all()  # the zero baseline
    assert len({tuple(row.tolist()) for row in keep}) > 2 and result.d0 > 0


def test_a_second_methods_source_masks_are_read_back_not_run(lm, tiny_tokenizer, monkeypatch):
    """Masks over a few sources repeat across methods (coupled uniforms, ``2^n`` possible masks; the LDS's held-out
    masks are the same for every method): a second method's source pi-Soft and removal metrics run only the
    masks the first did not, and equal what a model with nothing kept gives; token-level pi-Soft keeps nothing."""
    target = forced(context_prompt(tiny_tokenizer, DOCUMENTS, QUERY), answer_ids(tiny_tokenizer))
    runs = {"masks": 0, "tokens": 0}
    forward, model_forward = engine_module.PerturbationEngine._forward, lm.model.forward

    def counting(self, keep):
        runs["masks"] += keep.shape[0]
        return forward(self, keep)

    def counting_tokens(*args, **kwargs):
        runs["tokens"] += kwargs["input_ids"].numel() if kwargs.get("input_ids") is not None else 0
        return model_forward(*args, **kwargs)

    monkeypatch.setattr(engine_module.PerturbationEngine, "_forward", counting)
    monkeypatch.setattr(lm.model, "forward", counting_tokens)
    first = SourceInput(target, torch.tensor([[0.1, 3.0, -1.0, 2.0, 0.5]]), True)
    second = SourceInput(target, torch.tensor([[2.0, 0.2, 1.0, -0.5, 0.4]]), True)
    soft = {"samples": 6, "pis": (0.3, 0.5, 0.7), "seed": 1}

    def both(given: SourceInput) -> tuple:
        return source_soft(lm, given, [0, 1], **soft).to_dict(), removal_metrics(lm, given, k_max=2, lds_ablations=8)

    both(first)
    runs.update(masks=0, tokens=0)
    warm, warm_runs = both(second), dict(runs)
    lm.forget()
    runs.update(masks=0, tokens=0)
    cold = both(second)
    assert warm_runs["masks"] < runs["masks"] and warm_runs["tokens"] < runs["tokens"]
    for name in ("pi_soft_ns", "pi_soft_nc"):
        assert warm[0]["metrics"][name]["values"] == pytest.approx(cold[0]["metrics"][name]["values"], abs=1e-6)
    assert warm[1].top_k_drop == pytest.approx(cold[1].top_k_drop, abs=1e-5)
    assert warm[1].lds == pytest.approx(cold[1].lds, abs=1e-9)
    lm.forget()
    n = target.span[1] - target.span[0]
    evaluate_target(lm, target, torch.rand(target.n_steps, n, generator=torch.Generator().manual_seed(0)), [0],
                    samples=2, pis=(0.5,))
    assert not [key for key in lm.kept.entries if key[0][0] == "perturbed-probs"]


def test_the_source_metrics_are_registered():
    assert {"source-soft", "source-removal", "source-gold"} <= set(registry.METRICS)
    assert {"source_top_k", "lds_ablations"} <= set(registry.declared_options())
