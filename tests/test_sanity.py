"""Sanity checks for methods (llmattr.faithfulness.sanity): toy methods whose randomisation result is known by hand."""

from __future__ import annotations

import pytest
import torch

import llmattr
from conftest import build_tiny
from llmattr import methods
from llmattr.errors import LlmattrError
from llmattr.faithfulness import evaluate
from llmattr.faithfulness.sanity import (
    PERMUTED_MODEL,
    checked_blocks,
    data_randomization,
    model_randomization,
    randomized,
    randomized_draw,
    spearman,
)
from llmattr.methods import AttributionMethod
from llmattr.models.anatomy import decoder_blocks
from llmattr.stats import stable_seed

TEXT = "a fine good film with a dull end"


class Position(AttributionMethod):
    """Scores 1..m along the span: they do not depend on the weights at all."""

    name, family, summary, cost = "toy-position", "toy", "position (a test's own method)", "no pass"
    needs_gradients = signed = False

    def attribute(self, lm, target) -> torch.Tensor:
        a, b = target.span
        return torch.arange(1, b - a + 1, dtype=torch.float64).expand(target.n_steps, b - a).clone()


def top_block_scores(lm, ids: torch.Tensor) -> torch.Tensor:
    """``||W_up e_i||``: the norm of each token's embedding through the top block's MLP up projection."""
    up = decoder_blocks(lm.model)[-1].mlp.up_proj.weight
    return (lm.embed(ids.to(lm.device)).double() @ up.double().T).norm(dim=-1).cpu()


class TopBlock(AttributionMethod):
    """``||W_up e_i||`` with ``W_up`` of the top block: depends on the top block's weights alone."""

    name, family, summary, cost = "toy-top-block", "toy", "top block's MLP norm (a test's own method)", "no pass"
    needs_gradients = signed = False

    def attribute(self, lm, target) -> torch.Tensor:
        a, b = target.span
        return top_block_scores(lm, target.input_ids[0, a:b]).expand(target.n_steps, b - a).clone()


@pytest.fixture
def toy_methods():
    for cls in (Position, TopBlock):
        methods.register(cls)
    yield
    for cls in (Position, TopBlock):
        methods.REGISTRY.pop(cls.name)


@pytest.fixture
def deep_llama(tiny_tokenizer):
    return build_tiny("llama", tiny_tokenizer, num_hidden_layers=4)


def by_layer(rows, name: str) -> dict[int, float]:
    return {int(row.x): row.value for row in rows if row.metric == name}


def test_spearman_by_hand():
    assert spearman(torch.tensor([1.0, 2, 3]), torch.tensor([3.0, 2, 1])) == pytest.approx(-1)
    # ties get average ranks: ranks (1, 2.5, 2.5) vs (1, 2, 3): rho = 0.866...
    assert spearman(torch.tensor([1.0, 2, 2]), torch.tensor([1.0, 2, 3])) == pytest.approx(3 ** 0.5 / 2)
    assert spearman(torch.tensor([1.0, 1, 1]), torch.tensor([1.0, 2, 3])) is None  # nothing ranked
    assert spearman(torch.tensor([1.0, 2, 3]), torch.tensor([5.0, 5, 5])) == 0.0  # the ranking was lost


def test_checked_blocks_top_first_and_block_zero():
    assert checked_blocks(4, 1) == [3, 2, 1, 0]
    assert checked_blocks(6, 2) == [5, 3, 1, 0]
    assert checked_blocks(1, 3) == [0]


def test_weight_independent_method_keeps_rho_one_everywhere(deep_llama, toy_methods):
    expl = llmattr.explain(TEXT, model=deep_llama, method="toy-position", task="sentiment")
    rows = evaluate(expl, deep_llama, metrics=["model-randomization"])["model-randomization"]
    one = pytest.approx(1.0, abs=1e-12)  # rho of identical vectors up to rounding
    assert by_layer(rows, "cascade_spearman") == dict.fromkeys(range(4), one)
    assert by_layer(rows, "independent_spearman") == dict.fromkeys(range(4), one)


def test_top_block_method_drops_exactly_when_the_top_block_is_randomised(deep_llama, toy_methods):
    expl = llmattr.explain(TEXT, model=deep_llama, method="toy-top-block", task="sentiment")
    a, b = expl.span
    ids = torch.tensor(expl.token_ids[a:b])
    trained = top_block_scores(deep_llama, ids)
    # the top block's random draw, by hand: W_up's turn comes after the parameters registered before it
    generator = torch.Generator().manual_seed(stable_seed(0, "block", 3))
    top = decoder_blocks(deep_llama.model)[3]
    drawn = {name: randomized_draw(p, generator) for name, p in top.named_parameters()}
    expected = spearman(trained, (deep_llama.embed(ids).double() @ drawn["mlp.up_proj.weight"].double().T)
                        .norm(dim=-1).cpu())
    assert expected < 0.95
    rows = model_randomization(deep_llama, expl)
    cascade, independent = by_layer(rows, "cascade_spearman"), by_layer(rows, "independent_spearman")
    one = pytest.approx(1.0, abs=1e-12)  # rho of identical vectors up to rounding
    assert independent == {0: one, 1: one, 2: one, 3: pytest.approx(expected, abs=1e-12)}
    # every cascade step includes the top block, with the same seeded draw: the same rho at every depth
    assert cascade == dict.fromkeys(range(4), pytest.approx(expected, abs=1e-12))


def test_weights_restored_exactly_and_scores_unchanged(deep_llama):
    expl = llmattr.explain(TEXT, model=deep_llama, method="saliency", task="sentiment")
    before = {name: p.detach().clone() for name, p in deep_llama.model.named_parameters()}
    with randomized(deep_llama, [3, 1], seed=3):
        assert not torch.equal(decoder_blocks(deep_llama.model)[1].mlp.up_proj.weight, before[
            "model.layers.1.mlp.up_proj.weight"])
    rows = evaluate(expl, deep_llama, metrics=["model-randomization"], seed=3)["model-randomization"]
    assert min(row.value for row in rows) < 0.99  # saliency does change with the weights
    after = dict(deep_llama.model.named_parameters())
    assert all(torch.equal(after[name], value) for name, value in before.items())
    again = llmattr.explain(TEXT, model=deep_llama, method="saliency", task="sentiment")
    assert again.score_matrix(raw=True).tolist() == expl.score_matrix(raw=True).tolist()


def test_data_randomization_of_a_model_with_itself_and_another(deep_llama, tiny_tokenizer, toy_methods):
    expl = llmattr.explain(TEXT, model=deep_llama, method="toy-top-block", task="sentiment")
    same = data_randomization(deep_llama, deep_llama, expl)
    assert [row.value for row in same] == [pytest.approx(1.0, abs=1e-12)] and same[0].metric == "data_spearman"
    other = build_tiny("llama", tiny_tokenizer, seed=7, num_hidden_layers=4)
    a, b = expl.span
    ids = torch.tensor(expl.token_ids[a:b])
    rows = data_randomization(deep_llama, other, expl)
    assert rows[0].value == pytest.approx(spearman(top_block_scores(deep_llama, ids), top_block_scores(other, ids)))


def test_data_randomization_needs_the_permuted_model(deep_llama):
    expl = llmattr.explain(TEXT, model=deep_llama, method="random", task="sentiment")
    with pytest.raises(LlmattrError, match="--permuted-model"):
        evaluate(expl, deep_llama, metrics=["data-randomization"])


def test_permuted_model_check_hook_refuses_without_loading(tmp_path):
    """The check hook runs in ``Option.check`` (config and API alike): a missing path or a folder without
    config.json is refused; empty (not given), a hub id and a model folder pass unchanged."""
    with pytest.raises(LlmattrError, match="--permuted-model: model path not found"):
        PERMUTED_MODEL.check(str(tmp_path / "missing"))
    with pytest.raises(LlmattrError, match="is not a model folder"):
        PERMUTED_MODEL.check(str(tmp_path))
    (tmp_path / "config.json").write_text("{}")
    assert [PERMUTED_MODEL.check(v) for v in ("", "org/model", str(tmp_path))] == ["", "org/model", str(tmp_path)]
