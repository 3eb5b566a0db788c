"""Ranking metrics: toy model with a known answer, hand-computed log-odds, deletion by padding."""

from __future__ import annotations

import math

import pytest
import torch

from conftest import build_tiny
from llmattr.api import prepare
from llmattr.errors import LlmattrError
from llmattr.faithfulness import ranking
from llmattr.faithfulness.ranking import aggregate, counts, deleted_probs, ranking_metrics, top_masks
from llmattr.request import Request

TEXT = "quick brown fox jumps over lazy dog"
LABELS = [5, 6]


def evidence_model(tokenizer, pushes: dict[int, float]):
    """One layer, uniform attention (q = k = 0), identity values, no MLP: the last position sees the mean
    of the RMS-normalised embeddings. Token t's unit embedding has ``pushes[t]`` along direction u, and
    the LM head reads u for label 5 and -u for label 6: the known contribution of each token."""
    lm = build_tiny("llama", tokenizer, seed=0, num_hidden_layers=1, num_key_value_heads=4)
    model, d = lm.model, lm.model.config.hidden_size
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        layer = model.model.layers[0]
        layer.self_attn.q_proj.weight.zero_()
        layer.self_attn.k_proj.weight.zero_()
        layer.self_attn.v_proj.weight.copy_(torch.eye(d))
        layer.self_attn.o_proj.weight.copy_(torch.eye(d))
        layer.mlp.down_proj.weight.zero_()
        w = torch.randn(len(tokenizer), d, generator=gen)
        w[:, 0] = 0
        w = w / w.norm(dim=-1, keepdim=True)
        s = torch.zeros(len(tokenizer))
        for token, push in pushes.items():
            s[token] = push
        model.model.embed_tokens.weight.copy_(s[:, None] * torch.eye(d)[0] + (1 - s[:, None] ** 2).sqrt() * w)
        model.lm_head.weight.zero_()
        model.lm_head.weight[LABELS[0], 0] = 0.3
        model.lm_head.weight[LABELS[1], 0] = -0.3
    return lm


@pytest.fixture
def toy(tiny_tokenizer):
    ids = tiny_tokenizer(TEXT, add_special_tokens=False)["input_ids"]
    assert len(set(ids)) == len(ids)
    pushes = torch.linspace(0.95, -0.3, len(ids))[torch.randperm(len(ids), generator=torch.Generator().manual_seed(1))]
    lm = evidence_model(tiny_tokenizer, dict(zip(ids, pushes.tolist(), strict=True)))
    target = prepare(lm, TEXT, Request("generate", max_new_tokens=1))
    return lm, target, pushes


@pytest.mark.parametrize("removal", ["zero", "delete"])
def test_perfect_ranking_beats_reversed_on_a_known_toy(toy, removal):
    lm, target, pushes = toy
    best = ranking_metrics(pushes, lm, target, LABELS, removal=removal)
    worst = ranking_metrics(-pushes, lm, target, LABELS, removal=removal)
    assert best.predicted == worst.predicted == 0  # the pushes sum to favour label 5
    assert best.deletion.auc > worst.deletion.auc
    assert best.insertion.auc < worst.insertion.auc
    assert best.comprehensiveness_aopc > worst.comprehensiveness_aopc
    assert best.sufficiency_aopc < worst.sufficiency_aopc
    assert best.log_odds < worst.log_odds
    for result in (best, worst):  # both curves end at the same inputs: nothing removed / all removed
        assert result.deletion.flip[0] == pytest.approx(1 - result.p_original, abs=1e-5)
        assert result.deletion.flip[-1] == pytest.approx(result.insertion.flip[0], abs=1e-5)
        assert len(result.deletion.flip) == 21 and result.deletion.fractions[1] == pytest.approx(0.05)
        assert set(result.to_dict()) >= {"deletion", "insertion", "comprehensiveness", "log_odds"}


def test_deleted_tokens_match_a_forward_of_the_shortened_prompt(toy):
    lm, target, _ = toy
    a, b = target.span
    keep = torch.ones(3, b - a)
    keep[0, 1] = 0
    keep[1, [0, 2, 3]] = 0
    probs = deleted_probs(lm, target, 0, keep)
    for row in range(3):
        ids = target.input_ids[0]
        kept = torch.cat([ids[:a], ids[a:b][keep[row].bool()], ids[b:]])
        with torch.no_grad():
            ref = torch.softmax(lm.model(input_ids=kept[None].to(lm.device)).logits[0, -1], -1)
        torch.testing.assert_close(probs[row], ref, atol=1e-5, rtol=1e-4)


class FakePerturbed:
    """p(label 0) = 0.6 clean; removing the top token moves the label mass to (0.3, 0.5); vocab of 3."""

    def __init__(self, lm, target, step, removal, routing, batch_size):
        self.clean = torch.tensor([[0.6, 0.2, 0.2]])

    def probs(self, keep):
        top_kept = keep[:, 0] > 0
        return torch.where(top_kept[:, None], torch.tensor([0.6, 0.2, 0.2]), torch.tensor([0.3, 0.5, 0.2]))


def test_log_odds_comp_suff_hand_computed(monkeypatch, toy):
    lm, target, _ = toy
    monkeypatch.setattr(ranking, "Perturbed", FakePerturbed)
    m = target.span[1] - target.span[0]
    scores = torch.arange(m, 0, -1).double()  # token 0 is the top token
    r = ranking_metrics(scores, lm, target, label_ids=[0, 1])
    # clean: (0.6, 0.2) / 0.8 = (0.75, 0.25); top token removed: (0.3, 0.5) / 0.8 = (0.375, 0.625)
    assert r.p_original == pytest.approx(0.75)
    assert r.log_odds == pytest.approx(math.log(0.375 / 0.75))
    assert r.comprehensiveness_top_k == pytest.approx(0.375)
    assert r.sufficiency_top_k == pytest.approx(0.0)  # the top token is kept
    assert r.deletion.flip[0] == pytest.approx(0.25) and r.deletion.flip[1:] == pytest.approx([0.625] * 20)
    assert r.deletion.auc == pytest.approx(0.625 - 0.05 * (0.625 - 0.25) / 2)
    # paper 000 appendix E: the change from the clean flip probability 0.25
    assert r.deletion.change == pytest.approx([0.0] + [0.375] * 20)
    assert r.deletion.change_auc == pytest.approx(0.375 - 0.05 * 0.375 / 2)
    assert r.insertion.change_auc == pytest.approx(r.insertion.auc - 0.25)
    assert r.comprehensiveness == pytest.approx([0.375] * 9) and r.comprehensiveness_pred == [1] * 9
    agg = aggregate([r, r], gold=[0, 0])
    assert agg["comprehensiveness_accuracy"] == [0.0] * 9 and agg["sufficiency_accuracy"] == [1.0] * 9


def test_masks_and_counts():
    assert counts([0.05, 0.1, 0.5], 10) == [1, 1, 5]
    masks = top_masks(torch.tensor([0.1, 0.9, 0.5, 0.9]), [0, 1, 2, 4])
    assert masks.tolist() == [[False] * 4, [False, True, False, False], [False, True, False, True], [True] * 4]


def test_bad_inputs_raise_one_clear_error(toy):
    lm, target, pushes = toy
    with pytest.raises(LlmattrError, match="content span has"):
        ranking_metrics(pushes[:-1], lm, target, LABELS)
    with pytest.raises(LlmattrError, match="removal"):
        ranking_metrics(pushes, lm, target, LABELS, removal="mask")
    with pytest.raises(LlmattrError, match="NaN"):
        ranking_metrics(pushes * float("nan"), lm, target, LABELS)


def test_explanation_input_rebuilds_the_target(toy):
    from llmattr.api import attribute
    from llmattr.methods import get as get_method

    lm, target, _ = toy
    expl = attribute(lm, target, get_method("random"), Request("generate"), {"text": TEXT})
    r = ranking_metrics(expl, lm)  # free generation: flip = 1 - p(explained token)
    assert r.label_ids is None and r.predicted == 0
    ref = ranking_metrics(expl.score_matrix(raw=True)[0], lm, target)
    assert r.to_dict() == ref.to_dict()
    with pytest.raises(LlmattrError, match="step 3"):
        ranking_metrics(expl, lm, step=3)
