"""Alignment metrics: paper 003's worked example A.4, per-layer rows, evidence from a BLiMP explanation."""

from __future__ import annotations

import pytest
import torch

from llmattr.api import attribute, prepare
from llmattr.errors import LlmattrError
from llmattr.faithfulness.alignment import (
    alignment,
    average_precision,
    dot_product,
    evidence_vector,
    explanation_alignment,
    per_layer_scores,
)
from llmattr.methods import get as get_method
from llmattr.request import Request
from llmattr.tasks import get_task

# A.4: "Karla thinks/think about it", tokens [Karla, thinks, about, it], evidence Karla
E = [1, 0, 0, 0]
S = [0.3, 0.1, 0.5, 0.1]


def test_worked_example_a4_exactly():
    assert dot_product(S, E).tolist() == [pytest.approx(0.3)]
    assert average_precision(S, E).tolist() == [0.5]
    assert average_precision(S, [0, 0, 1, 0]).tolist() == [1.0]  # "if the evidence index were 2 ... 1.0"
    assert average_precision(S, [0, 1, 0, 0]).tolist() == [pytest.approx(1 / 3)]  # "index 1 ... 0.33"
    assert alignment(S, E).to_dict() == {"dot_product": [pytest.approx(0.3)], "average_precision": [0.5],
                                         "normalize": "sum", "level": "token"}


def test_ap_with_several_evidence_tokens_and_rows():
    # ranks [1, 3, 0, 2]: evidence {1, 0} found at ranks 1 and 3 -> (1/1 + 2/3) / 2
    scores = torch.tensor([[0.2, 0.9, 0.1, 0.5], [0.2, 0.9, 0.1, 0.5]])
    assert average_precision(scores, [1, 1, 0, 0]).tolist() == [pytest.approx(5 / 6)] * 2
    assert dot_product([2.0, -1.0, 1.0, 1.0], [1, 0, 0, 0], normalize="sum").tolist() == [0.5]
    with pytest.raises(LlmattrError, match="0/1 vector"):
        average_precision(S, [0, 0, 0, 0])


def test_blimp_evidence_maps_to_tokens_and_per_layer_rows(tiny_llama):
    task = get_task("blimp-darn")
    row = task.pair({"one_prefix_prefix": "The sister of doctors", "one_prefix_word_good": "writes",
                     "one_prefix_word_bad": "write"})
    target = prepare(tiny_llama, row, Request(task, max_new_tokens=1))
    expl = attribute(tiny_llama, target, get_method("logat"), Request(task), row)
    e = evidence_vector(expl, row["evidence_words"])
    tokens = expl.span_tokens
    assert "".join(t for t, keep in zip(tokens, e.tolist(), strict=True) if keep).strip() == "sister"
    assert evidence_vector(expl, row["evidence_words"], level="word").tolist() == [0, 1, 0, 0]
    result = explanation_alignment(expl)
    assert len(result.dot_product) == 1 and 0 <= result.average_precision[0] <= 1
    layers = per_layer_scores(tiny_llama, target, "logat")
    assert layers.shape == (2, len(tokens))
    assert len(alignment(layers, e).average_precision) == 2
    with pytest.raises(LlmattrError, match="no layer parameter"):
        per_layer_scores(tiny_llama, target, "grad-ellm")
