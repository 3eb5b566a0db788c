"""Every registry refuses a silent overwrite: a second, different entry under a taken name is an error
(one line naming the name), re-registering the same entry changes nothing."""

from __future__ import annotations

from dataclasses import replace

import pytest

from llmattr import methods, objectives
from llmattr.errors import LlmattrError
from llmattr.faithfulness import METRICS, Metric, register
from llmattr.tasks import TASKS, get_task, register_task


def test_a_method_name_is_registered_once():
    saliency = methods.REGISTRY["saliency"]

    class Impostor(saliency):
        name = "saliency"

    with pytest.raises(LlmattrError, match="method 'saliency' is already registered"):
        methods.register(Impostor)
    assert methods.REGISTRY["saliency"] is saliency
    assert methods.register(saliency) is saliency  # the same class again: a no-op


def test_a_metric_name_is_registered_once():
    original = METRICS["comp-suff"]
    with pytest.raises(LlmattrError, match="metric 'comp-suff' is already registered"):
        register(Metric("comp-suff", lambda ctx, routing: []))
    assert METRICS["comp-suff"] is original
    assert register(original) is original


def test_a_task_name_is_registered_once():
    sst2 = get_task("sst2")
    with pytest.raises(LlmattrError, match="task 'sst2' is already registered"):
        register_task(replace(sst2, description="another SST-2"))
    assert TASKS["sst2"] is sst2
    assert register_task(replace(sst2)) == sst2  # an equal task: nothing changes


def test_an_objective_name_is_registered_once():
    logit = objectives.OBJECTIVES["logit"]
    with pytest.raises(LlmattrError, match="objective 'logit' is already registered"):
        objectives.objective("logit", "another logit")(lambda logits, ids, foil: logits.sum(-1))
    assert objectives.OBJECTIVES["logit"] is logit
    objectives.objective("logit", logit.summary, logit.contrastive)(logit.fn)  # the same function again
    assert objectives.OBJECTIVES["logit"] == logit
