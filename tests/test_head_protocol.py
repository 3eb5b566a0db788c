"""Paper 003's protocol on a sequence head (llmattr.faithfulness.head): the perturbed sequences, the confidence
drops and accuracies of eqs. 5-8 on an analytic toy head, Pearson's r for a regression head, the gradient methods
against autograd, and the Table 1 summary with its intervals and paired tests, by hand."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from conftest import build_tiny
from llmattr.errors import LlmattrError
from llmattr.faithfulness.head import (
    HEAD_METHODS,
    HeadFaithfulness,
    head_attribution,
    head_faithfulness,
    kept_sequences,
    summarize,
)
from llmattr.finetuning import head_model
from llmattr.methods import REGISTRY
from llmattr.methods.base import explains_head
from llmattr.methods.gradient import last_token_logits
from llmattr.tasks import get_task


class CountHead(torch.nn.Module):
    """Logits ``[0, count of token 7]`` of the real (unpadded) tokens; or one output, ``count(7) - count(8)``."""

    def __init__(self, regression=False):
        super().__init__()
        self.config = SimpleNamespace(pad_token_id=0)
        self.regression = regression

    def forward(self, input_ids, attention_mask):
        sevens = ((input_ids == 7) & attention_mask.bool()).sum(-1).double()
        if self.regression:
            return SimpleNamespace(logits=(sevens - ((input_ids == 8) & attention_mask.bool()).sum(-1))[:, None])
        return SimpleNamespace(logits=torch.stack([torch.zeros_like(sevens), sevens], -1))


def test_the_perturbed_sequences_drop_or_keep_the_top_k_percent():
    ids = torch.tensor([[10, 11, 12, 13, 14]])
    seqs = kept_sequences(ids, torch.tensor([0.1, 0.5, 0.3, 0.9, 0.2]), (0.2, 0.4))
    assert [s.tolist() for s in seqs] == [[10, 11, 12, 13, 14], [10, 11, 12, 14], [10, 12, 14], [13], [11, 13]]
    # 10% of 5 tokens rounds to 1 (half up); 90% keeps one token in the comprehensiveness sequence
    assert [len(s) for s in kept_sequences(ids, torch.arange(5.0), (0.1, 0.9))] == [5, 4, 1, 1, 4]


def test_confidence_drop_and_accuracy_of_eqs_5_to_8_by_hand():
    ids = torch.tensor([[7, 3, 7, 4]])  # two sevens: p(1) = e^2 / (1 + e^2)
    scores = torch.tensor([0.9, 0.1, 0.8, 0.2])  # the sevens ranked first
    r = head_faithfulness(CountHead(), ids, scores, k_grid=(0.25, 0.5))
    p = lambda c: np.exp(c) / (1 + np.exp(c))  # noqa: E731
    assert r.predicted == 1 and r.p_original == pytest.approx(p(2))
    # comprehensiveness: 1 seven left, then none; sufficiency: 1 seven kept, then both
    assert r.comprehensiveness == pytest.approx([p(2) - p(1), p(2) - p(0)])
    assert r.sufficiency == pytest.approx([p(2) - p(1), 0.0])
    assert r.comprehensiveness_pred == [1.0, 0.0] and r.sufficiency_pred == [1.0, 1.0]  # p(0) = 0.5: argmax 0


def test_a_regression_head_gives_its_outputs_and_pearson_over_k():
    r = head_faithfulness(CountHead(regression=True), torch.tensor([[7, 8, 7, 5]]), torch.tensor([3.0, 0, 2, 1]),
                          k_grid=(0.25, 0.5))
    assert r.predicted is None and r.p_original == 1.0  # 2 sevens - 1 eight
    assert r.comprehensiveness_pred == [0.0, -1.0] and r.sufficiency_pred == [1.0, 2.0]
    results = [HeadFaithfulness([0.5], None, 0, [], [], [c], [s]) for c, s in ((1, 1), (2, 3), (3, 2))]
    table = summarize({"normxlogit": results, "random": results[::-1]}, [1.0, 2.0, 4.0])
    assert table["regression"] and set(table["methods"]["normxlogit"]) == {"comprehensiveness_acc", "sufficiency_acc"}
    assert table["methods"]["normxlogit"]["comprehensiveness_acc"]["mean"] == pytest.approx(
        np.corrcoef([1, 2, 3], [1, 2, 4])[0, 1])
    assert table["methods"]["random"]["comprehensiveness_acc"]["mean"] == pytest.approx(
        np.corrcoef([3, 2, 1], [1, 2, 4])[0, 1])


def test_the_summary_averages_over_k_with_intervals_and_paired_tests():
    def result(cd, pred):
        return HeadFaithfulness([0.1, 0.2], 1, 0.9, cd, [0.0, 0.0], pred, [1.0, 1.0])
    good = [result([0.4, 0.6], [0.0, 0.0]) for _ in range(8)]
    rand = [result([0.1, 0.1 * (i % 2)], [1.0, 0.0]) for i in range(8)]
    table = summarize({"normxlogit": good, "random": rand}, [1.0] * 8)
    cell = table["methods"]["normxlogit"]["comprehensiveness"]
    assert cell["mean"] == pytest.approx(0.5) and cell["curve"] == pytest.approx([0.4, 0.6])
    assert cell["low"] == cell["high"] == pytest.approx(0.5)  # every example the same
    assert table["methods"]["random"]["comprehensiveness"]["mean"] == pytest.approx((0.1 + 0.05) / 2)
    assert table["methods"]["random"]["comprehensiveness_acc"]["mean"] == pytest.approx(0.5)  # right at K=10% only
    assert table["methods"]["random"]["comprehensiveness_acc"]["curve"] == [1.0, 0.0]
    assert cell["p_vs_random"] == pytest.approx(2 / 2 ** 8)  # exact sign-flip test: all 8 differences one way


@pytest.mark.parametrize("task", ["sst2-head", "stsb-regression"])
def test_the_head_on_embeddings_reads_the_last_token_as_transformers_does(tiny_tokenizer, task):
    """``last_token_logits`` (the gradient methods' forward, without transformers' padding warning) gives the
    logits the sequence-classification model gives on the same unpadded ids."""
    lm = build_tiny("llama", tiny_tokenizer)
    model = head_model(lm, get_task(task), seed=0)
    ids = torch.tensor([[5, 17, 23, 9, 41], [6, 7, 8, 9, 10]], device=lm.device)
    with torch.no_grad():
        got = last_token_logits(model, model.get_input_embeddings()(ids))
        want = model(input_ids=ids).logits
    assert got.shape == want.shape == (2, model.config.num_labels)
    torch.testing.assert_close(got, want)


def test_the_gradient_methods_are_the_l1_norms_of_autograd_on_the_head(tiny_tokenizer):
    lm = build_tiny("llama", tiny_tokenizer)
    model = head_model(lm, get_task("sst2-head"), seed=0)
    ids = torch.tensor([[5, 17, 23, 9, 41]], device=lm.device)
    x = model.get_input_embeddings()(ids).detach().requires_grad_(True)
    label = int(model(input_ids=ids).logits[0].argmax())
    p = model(inputs_embeds=x).logits.softmax(-1)[0, label]
    (grad,) = torch.autograd.grad(p, x)
    torch.testing.assert_close(head_attribution(model, ids, "saliency").float(), grad[0].abs().sum(-1))
    torch.testing.assert_close(head_attribution(model, ids, "input-x-gradient").float(),
                               (grad[0] * x[0]).abs().sum(-1))
    # IG (zero baseline): sum_k w_k dF/dx(alpha_k x) * x at paper 003's 25 points (Gauss-Legendre on [0, 1])
    nodes, w = np.polynomial.legendre.leggauss(25)
    alphas = torch.tensor((1 + nodes) / 2, dtype=torch.float32, device=x.device)
    points = (alphas[:, None, None] * x.detach()[0]).requires_grad_(True)
    q = model(inputs_embeds=points).logits.softmax(-1)[:, label].sum()
    (g,) = torch.autograd.grad(q, points)
    weights = torch.tensor(w / 2, dtype=torch.float32, device=g.device)[:, None, None]
    reference = ((weights * g).sum(0) * x.detach()[0]).abs().sum(-1)
    torch.testing.assert_close(head_attribution(model, ids, "integrated-gradients").float(), reference)
    for method in HEAD_METHODS:
        assert head_attribution(model, ids, method).shape == (5,)
    assert torch.equal(head_attribution(model, ids, "random", 3), head_attribution(model, ids, "random", 3))


def test_a_regression_head_s_pearson_r_at_every_k_is_stored_and_reported(tmp_path):
    """STS-B's measure (eqs. 6 and 8 with Pearson's r): comp-suff stores a regression head's output at each K and
    the gold score; the report's table holds the mean over K of r, its figure r at each K, both by hand."""
    import math

    from llmattr.api import catalog
    from llmattr.faithfulness.head import HeadFaithfulness
    from llmattr.faithfulness.ranking import regression_rows
    from llmattr.report import figures, head, write_model_report
    from llmattr.store import MetricOutput, Results, Store, Unit

    gold = [0.0, 1.0, 2.0, 3.0]
    outputs = {  # method -> (comprehensiveness outputs at K = 0.1, 0.5; sufficiency outputs), one row per example
        "normxlogit": ([[1, 3], [3, 2], [5, 1], [7, 0]], [[0, 1], [1, 1], [0, 1], [1, 2]]),
        "random": ([[1, 1], [0, 0], [0, 0], [1, 1]], [[0, 0], [1, 1], [2, 2], [3, 3]]),
    }
    # by hand: comp r = (1, -1) and (0, 0); suff r = (1/sqrt 5, sqrt(3/5)) and (1, 1)
    r = {("normxlogit", "comprehensiveness"): [1.0, -1.0], ("normxlogit", "sufficiency"): [1 / math.sqrt(5),
                                                                                            math.sqrt(3 / 5)],
         ("random", "comprehensiveness"): [0.0, 0.0], ("random", "sufficiency"): [1.0, 1.0]}
    with Store(tmp_path / "s.sqlite") as store:
        store.check_settings("m", {"model_card": {"task": "stsb-regression"}})
        for method, (comp, suff) in outputs.items():
            for i, y in enumerate(gold):
                result = HeadFaithfulness([0.1, 0.5], None, 0.0, comp[i], suff[i], comp[i], suff[i])
                rows = regression_rows(result, y)
                assert [(row.metric, row.x) for row in rows][-1] == ("gold_score", None)
                store.write(Unit("m", "stsb", f"e{i}", method, "{}"), '{"steps": []}', 0.0,
                            [MetricOutput("comp-suff", "none", 0.0, rows)])
    cat = catalog()
    results = Results([tmp_path / "s.sqlite"], cat.method_defaults, cat.datasets)
    table = head.pearson_table(results, "m", head.Stats(resamples=200, controls=("random",)))
    for section, key in zip(table.sections, ("comprehensiveness", "sufficiency"), strict=True):
        for method, cells in section.rows:
            assert cells[0].value == pytest.approx(np.mean(r[method, key]), abs=1e-12)
    assert table.tests.sections[1].rows[0][1][0].value is not None  # normxlogit's p vs random
    drawn = []
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(figures, "_save", lambda fig, path: drawn.append(fig) or path)
        written = head.pearson_figures(results, "m", tmp_path, resamples=200, controls=("random",))
    assert [f.path.name for f in written] == ["fig2_comp_suff_pearson_stsb.png"]
    for ax, key in zip(drawn[0].axes, ("comprehensiveness", "sufficiency"), strict=True):
        assert {line.get_label(): list(line.get_ydata()) for line in ax.lines} == {
            method: pytest.approx(r[method, key], abs=1e-12) for method in outputs}
    write_model_report(results, "m", tmp_path / "report", ["md"], 200, catalog=cat)
    report = (tmp_path / "report" / "report.md").read_text()
    assert "Pearson r (paper 003 Table 1, STS-B)" in report and "fig2_comp_suff_pearson_stsb.png" in report


def test_kept_sequences_delete_only_the_texts_tokens():
    """Issue 51 item 4: with a span (the example's text), the template's tokens before and after it ("Text:") stay
    in every comprehensiveness and sufficiency sequence; only the text's tokens are ranked and deleted."""
    ids = torch.tensor([[90, 91, 10, 11, 12, 13, 14, 92]])  # 90, 91: "Text", ":"; 92: a trailing template token
    seqs = kept_sequences(ids, torch.tensor([0.1, 0.5, 0.3, 0.9, 0.2]), (0.2, 0.4), span=(2, 7))
    assert seqs[0].tolist() == ids[0].tolist()
    assert [s.tolist() for s in seqs[1:3]] == [[90, 91, 10, 11, 12, 14, 92], [90, 91, 10, 12, 14, 92]]  # comp
    assert [s.tolist() for s in seqs[3:]] == [[90, 91, 13, 92], [90, 91, 11, 13, 92]]  # suff: top tokens alone


@pytest.mark.parametrize("name", ["sst2-head", "imdb-head", "sentiment-head", "qnli-head", "boolq-head",
                                  "stsb-regression"])
def test_every_head_task_attributes_its_text_and_not_the_template_around_it(tiny_tokenizer, name):
    """The head's span starts at the first field's first token and ends with the last field's last token: the
    template's words before the first field and after the last are never attributed."""
    task = get_task(name)
    example = {field: f"alpha {field} omega" for field in task.fields}
    text, (start, end) = task.user_content(example)
    offsets = tiny_tokenizer(text, return_offsets_mapping=True)["offset_mapping"]
    first, last = task.head_span(offsets, example)
    assert offsets[first][0] <= start < offsets[first][1] and offsets[last - 1][0] < end <= offsets[last - 1][1]
    assert all(b <= start or a >= end for a, b in offsets[:first] + offsets[last:])
    assert text[offsets[first][0]: offsets[last - 1][1]].strip().startswith("alpha")


def test_head_methods_dispatch_through_the_method_registry(monkeypatch):
    """Paper 003's methods are the registered methods that define ``head_scores`` (no list of names beside the
    registry); a method without it is refused in one line naming those that have it; a newly registered method
    with ``head_scores`` is called as they are."""
    assert sorted(HEAD_METHODS) == sorted(name for name, cls in REGISTRY.items() if explains_head(cls))
    assert [name for name in HEAD_METHODS if REGISTRY[name].head_signed] == ["normxlogit", "logat"]
    with pytest.raises(LlmattrError, match=r"^lime does not explain a sequence head; use one of .*normxlogit"):
        head_attribution(None, torch.zeros((1, 3), dtype=torch.long), "lime")

    class Toy(REGISTRY["random"]):
        name = "toy-head"

        @classmethod
        def head_scores(cls, model, input_ids, seed=0):
            return torch.arange(input_ids.shape[1], dtype=torch.float64) + seed

    monkeypatch.setitem(REGISTRY, "toy-head", Toy)
    assert torch.equal(head_attribution(None, torch.zeros((1, 3), dtype=torch.long), "toy-head", seed=2),
                       torch.tensor([2.0, 3.0, 4.0], dtype=torch.float64))
