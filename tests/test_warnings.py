"""Our calls into transformers use its current API: no method, metric or generation makes it warn (issue 35).

pyproject's pytest configuration ignores FutureWarning and DeprecationWarning for the whole suite (torch's and
other libraries' own warnings); these tests turn the ones transformers raises back into errors, so a call of ours
that transformers deprecates (``past_key_values=`` for ``cache=`` in 5.x) fails here before users see it.
"""

from __future__ import annotations

import pytest

import llmattr
from llmattr import methods
from llmattr.faithfulness import METRICS

TEXT = "An engrossing film that is never boring, with a terrific cast."
FAST = {"n_steps": 2, "n_samples": 2}  # a path method's points, a sampling method's samples: the call, not the estimate

pytestmark = [pytest.mark.filterwarnings("error::FutureWarning"),
              pytest.mark.filterwarnings("error::DeprecationWarning:transformers")]


def fast_params(name: str) -> dict:
    defaults = methods.REGISTRY[name].defaults
    return {k: v for k, v in FAST.items() if k in defaults}


@pytest.mark.parametrize("task, kwargs", [("sentiment", {}), ("generate", {"max_new_tokens": 2})])
@pytest.mark.parametrize("name", sorted(methods.REGISTRY))
def test_every_method_runs_without_a_transformers_warning(tiny_lm, name, task, kwargs):
    """Each registered method, twice (so the kept prefix caches are both filled and read), on each tiny model."""
    for _ in range(2):
        try:
            llmattr.explain(TEXT, model=tiny_lm, method=name, task=task, progress=False, **kwargs, **fast_params(name))
        except llmattr.LlmattrError:  # a method that refuses this model says so in one line: not a warning
            return


def test_every_metric_runs_without_a_transformers_warning(tiny_lm):
    """The faithfulness metrics' perturbation passes (the shared template prefix, ``padded_last_probs``)."""
    expl = llmattr.explain(TEXT, model=tiny_lm, method="saliency", task="sentiment", progress=False)
    for name in sorted(METRICS):
        options = {"samples": 2} if "soft" in name else {}
        try:
            llmattr.evaluate(expl, tiny_lm, metrics=[name], **options)
        except llmattr.LlmattrError:  # a metric that needs other evidence (alignment) refuses in one line
            continue


def test_unrankable_scores_warn_with_the_method_the_steps_and_why():
    """Issue 51 item 5: leave-one-out's -0.23 and -0.41 (signed, no positive part) are named as such, with the
    method and the step; all-zero and constant steps each say so."""
    import torch

    from llmattr.explanation import Explanation

    raw = torch.tensor([[-0.23, -0.41], [0.0, 0.0], [1.0, 2.0], [3.0, 3.0], [-1.0, -2.0]])
    expl = Explanation.from_raw(raw, True, step_tokens=list("abcde"), step_ids=[1, 2, 3, 4, 5],
                                positions=[3, 4, 5, 6, 7], model="m", method="leave-one-out", params={},
                                tokens=["x", "y", "z"], token_ids=[1, 2, 3], span=(1, 3), text="yz")
    assert expl.warnings == [
        "leave-one-out: signed scores with no positive part (the soft metrics keep the positive part) at steps 0, 4: "
        "retain probability 0.5 for every token (no token ranks above another)",
        "leave-one-out: all-zero scores at step 1: retain probability 0.5 for every token (no token ranks above "
        "another)",
        "leave-one-out: constant scores at step 3: retain probability 0.5 for every token (no token ranks above "
        "another)"]
    assert [step.scores for step in expl.steps][2] == [0.0, 1.0]
