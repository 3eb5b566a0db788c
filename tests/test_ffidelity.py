"""F-Fidelity (Zheng et al., ICLR 2025): the fine-tuning's random-mask augmentation (``finetune --mask-augment``)
and the ``f-fidelity`` metric's FFid+ / FFid-, against values known by hand."""

from __future__ import annotations

import json
import math
from collections import Counter

import pytest
import torch

from conftest import build_tiny
from llmattr.api import prepare
from llmattr.errors import LlmattrError
from llmattr.faithfulness import ffidelity
from llmattr.faithfulness.ffidelity import augment_mask, f_fidelity, removal_bound, removal_sets
from llmattr.faithfulness.ranking import deleted_probs
from llmattr.faithfulness.ranks import K_GRID, counts
from llmattr.finetuning import FinetuneConfig, MaskAugmented, label_sequence
from llmattr.models.card import CARD_NAME
from llmattr.request import Request
from llmattr.tasks import get_task
from test_cli_checks import NO_MODEL, one_line_error, run_cli
from test_finetune import straight_and_resumed, toy_file, toy_finetune
from test_ranking import LABELS, TEXT, evidence_model

EVIDENCE = (0, 1, 2)  # the fake model's evidence tokens: each one deleted lowers p(label 0) by 0.1
DROP = 0.1


def fake_deleted_probs(lm, target, step, removed, batch_size):
    """p over a vocabulary of 3: label 0 has 0.8 - 0.1 c, label 1 0.2 + 0.1 c, where c counts the deleted
    evidence tokens; the third token none (so the label-word renormalisation changes nothing)."""
    c = removed[:, list(EVIDENCE)].sum(-1).double()
    return torch.stack([0.8 - DROP * c, 0.2 + DROP * c, torch.zeros_like(c)], -1)


@pytest.fixture
def target(tiny_tokenizer):
    lm = build_tiny("llama", tiny_tokenizer)
    return lm, prepare(lm, TEXT, Request("generate", max_new_tokens=1))


def test_ffid_plus_and_minus_are_the_expected_confidence_drops_of_a_known_model(monkeypatch, target):
    """Scores rank token j at place j; a uniformly random set S of min(|T|, K) tokens of the top set T holds on
    average min(|T|, K) |T n E| / |T| evidence tokens (hypergeometric mean), each a 0.1 drop: FFid+ =
    0.1 min(|T|, K) |T n E| / |T|, FFid- the same on the complement. Where the pool has at most K tokens the
    removal is the whole pool and the value is exact; elsewhere it is a mean of N draws, within 4 standard errors
    (the hypergeometric variance)."""
    lm, tgt = target
    monkeypatch.setattr(ffidelity, "deleted_after_prefix", fake_deleted_probs)
    m = tgt.span[1] - tgt.span[0]
    beta, samples = 2.2 / m, 4000
    k = removal_bound(beta, m)
    assert k == 2 and m >= 10
    scores = torch.arange(m, 0, -1).double()
    r = f_fidelity(scores, lm, tgt, label_ids=[0, 1], beta=beta, samples=samples, seed=3)
    assert r.removed == 2 and r.p_original == pytest.approx(0.8)
    assert r.ratios == pytest.approx(list(K_GRID))
    exact = 0
    for i, t in enumerate(counts(K_GRID, m)):
        for value, pool, hits in ((r.plus[i], t, min(t, 3)), (r.minus[i], m - t, max(0, 3 - t))):
            n = min(pool, k)
            mean = n * hits / pool
            var = n * (hits / pool) * (1 - hits / pool) * (pool - n) / (pool - 1) if pool > 1 else 0.0
            exact += var == 0
            assert value == pytest.approx(DROP * mean, abs=4 * DROP * math.sqrt(var / samples) + 1e-12), (i, t)
    assert exact >= 3  # e.g. the top 2 tokens removed whole (0.2), the 2 left outside the top 14 (no evidence: 0)
    assert r.plus_mean == pytest.approx(sum(r.plus) / 9)


def test_the_removal_sets_are_random_subsets_of_the_right_pool_and_never_exceed_k():
    scores = torch.tensor([0.5, 3.0, -1.0, 2.0, 0.1, 0.0, 1.5, 0.2, 0.3, 0.4])  # ranking: 1, 3, 6, 0, 9, 8, 7, ...
    ratios, samples = (0.2, 0.5, 0.9), 3000
    plus, minus, k = removal_sets(scores, ratios, 0.3, samples, torch.Generator().manual_seed(0))
    assert k == 3 and plus.shape == minus.shape == (3, samples, 10)
    top = [{1, 3}, {1, 3, 6, 0, 9}, set(range(10)) - {2}]
    for i, t in enumerate(top):
        inside = torch.zeros(10, dtype=torch.bool)
        inside[list(t)] = True
        assert not (plus[i] & ~inside).any() and not (minus[i] & inside).any()
        assert (plus[i].sum(-1) == min(len(t), k)).all() and (minus[i].sum(-1) == min(10 - len(t), k)).all()
        freq = plus[i].double().mean(0)[inside]  # uniform subsets: every top token drawn min(|T|, K) / |T| of the time
        p = min(len(t), k) / len(t)
        assert freq.sub(p).abs().max() <= 4 * math.sqrt(p * (1 - p) / samples) + 1e-12
    again, _, _ = removal_sets(scores, ratios, 0.3, samples, torch.Generator().manual_seed(0))
    assert torch.equal(again, plus)


def test_a_faithful_ranking_has_a_larger_ffid_plus_and_smaller_ffid_minus_on_an_evidence_model(tiny_tokenizer):
    ids = tiny_tokenizer(TEXT, add_special_tokens=False)["input_ids"]
    pushes = torch.linspace(0.95, -0.3, len(ids))
    lm = evidence_model(tiny_tokenizer, dict(zip(ids, pushes.tolist(), strict=True)))
    tgt = prepare(lm, TEXT, Request("generate", max_new_tokens=1))
    best = f_fidelity(pushes, lm, tgt, LABELS, beta=0.3, samples=8)
    worst = f_fidelity(-pushes, lm, tgt, LABELS, beta=0.3, samples=8)
    assert best.plus_mean > worst.plus_mean and best.minus_mean < worst.minus_mean
    with pytest.raises(LlmattrError, match="label words"):
        f_fidelity(pushes, lm, tgt, None)
    with pytest.raises(LlmattrError, match=r"\[0, 1\)"):
        f_fidelity(pushes, lm, tgt, LABELS, beta=1.0)


def test_the_augmentation_deletes_up_to_round_beta_m_text_tokens_and_never_a_template_token(tiny_tokenizer):
    """k ~ U{0..K} tokens of the text removed: every count 0..K drawn about equally often, each text position
    k/m of the time on average (E[k] / m = K / (2 m)); the template's tokens always there, in order."""
    task = get_task("sst2")
    row = label_sequence(tiny_tokenizer, task, {"id": "a", "text": "a gorgeous witty seductive movie that never "
                                                "lets up and keeps its charm", "label": "Positive"},
                         task.label_ids(tiny_tokenizer))
    a, b = row["span"]
    m = b - a
    ids = row["input_ids"][:a] + [-1 - j for j in range(m)] + row["input_ids"][b:]  # text ids told apart
    row = {**row, "input_ids": ids}
    data, epochs = MaskAugmented([row], 0.2, seed=5), 3000
    k = removal_bound(0.2, m)
    assert k >= 2
    sizes, removed = Counter(), torch.zeros(m)
    for epoch in range(epochs):
        data.epoch = epoch
        got = data[0]
        assert got["labels"] == row["labels"]
        assert got["input_ids"][:a] == ids[:a] and got["input_ids"][len(got["input_ids"]) - (len(ids) - b):] == ids[b:]
        text = got["input_ids"][a: len(got["input_ids"]) - (len(ids) - b)]
        assert text == sorted(text, reverse=True)  # the kept text tokens keep their order
        sizes[m - len(text)] += 1
        removed += torch.tensor([t not in text for t in ids[a:b]], dtype=torch.float64)
    assert set(sizes) == set(range(k + 1))
    p = 1 / (k + 1)
    assert max(abs(c / epochs - p) for c in sizes.values()) <= 4 * math.sqrt(p * (1 - p) / epochs)
    assert (removed / epochs).mean().item() == pytest.approx(k / (2 * m), abs=4 * k / m / math.sqrt(epochs))
    data.epoch = 7
    first = data[0]
    assert data[0] == first  # one draw per (seed, epoch, row): a resumed run reads the same
    assert MaskAugmented([row], 0.2, seed=6)[0] != first or MaskAugmented([row], 0.2, seed=7)[0] != first


def test_augment_mask_draws_k_uniform_up_to_k():
    gen = torch.Generator().manual_seed(0)
    counts = Counter(int(augment_mask(20, 0.1, gen).sum()) for _ in range(600))
    assert set(counts) == {0, 1, 2} and min(counts.values()) > 150


@pytest.mark.parametrize("rate", [-0.1, 1.0, 1.5, True, "x"])
def test_a_bad_mask_rate_is_refused(rate):
    with pytest.raises(LlmattrError, match="mask-augment"):
        FinetuneConfig(mask_augment=rate).validate()


def test_mask_augment_is_for_the_label_loss_only():
    with pytest.raises(LlmattrError, match="--loss label"):
        FinetuneConfig(mask_augment=0.1, loss="lm").validate()
    with pytest.raises(LlmattrError, match="--loss label"):
        FinetuneConfig(task="sst2-head", head="classification", mask_augment=0.1).validate()


def test_a_mask_augmented_finetune_records_its_rate_and_resumes_to_the_same_weights(tiny_tokenizer, tmp_path):
    def run(lm, out, data, **options):
        return toy_finetune(lm, out, data, mask_augment=0.3, **options)

    card, _ = straight_and_resumed(run, tiny_tokenizer, tmp_path, toy_file(tmp_path / "toy.jsonl"))
    assert card["settings"]["mask_augment"] == 0.3 and card["hyperparameters"]["mask_augment"] == 0.3
    assert "mask_augment=0.3" in (tmp_path / "resumed" / "README.md").read_text()
    plain = toy_finetune(build_tiny("llama", tiny_tokenizer), tmp_path / "plain", tmp_path / "toy.jsonl", epochs=2,
                         save_steps=2)
    assert "mask_augment" not in plain["settings"] and "mask_augment" not in plain["hyperparameters"]
    assert json.loads((tmp_path / "plain" / CARD_NAME).read_text())["settings"] == plain["settings"]


def test_deletion_after_the_cached_template_equals_the_plain_deleted_forward(tiny_tokenizer):
    lm = build_tiny("llama", tiny_tokenizer)
    tgt = prepare(lm, TEXT, Request("generate", max_new_tokens=1))
    assert tgt.span[0] > 0  # the chat template before the text: the cached prefix
    m = tgt.span[1] - tgt.span[0]
    removed = torch.rand(12, m, generator=torch.Generator().manual_seed(0)) < 0.3
    removed[0] = False
    got = ffidelity.deleted_after_prefix(lm, tgt, 0, removed, batch_size=5)
    torch.testing.assert_close(got, deleted_probs(lm, tgt, 0, (~removed).long()), atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("command, args, fragment", [
    ("finetune", ["--mask-augment", "1.5", "--out", "{tmp}/new"], "--mask-augment must be a fraction in [0, 1)"),
    ("finetune", ["--mask-augment", "0.1", "--loss", "lm", "--out", "{tmp}/new"], "it trains with --loss label"),
    ("evaluate", ["--metrics", "f-fidelity", "--ffid-beta", "1", "--out", "{tmp}/s.sqlite"],
     "--ffid-beta must be a fraction in [0, 1)"),
    ("evaluate", ["--metrics", "f-fidelity", "--ffid-samples", "0", "--out", "{tmp}/s.sqlite"],
     "--ffid-samples must be at least 1"),
])
def test_bad_rates_are_one_line_and_exit_2_before_the_model_loads(command, args, fragment, tmp_path):
    one_line_error(run_cli(command, *NO_MODEL, *[a.format(tmp=tmp_path) for a in args]), fragment)
    assert not (tmp_path / "new").exists() and not (tmp_path / "s.sqlite").exists()
