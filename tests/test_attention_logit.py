"""Attention, l2-norm, LogAt, NormXLogit (paper 003 eqs. 2-4), sequence classifiers, `llmattr methods`."""

from __future__ import annotations

import pytest
import torch

from conftest import build_tiny
from llmattr import methods
from llmattr.api import prepare
from llmattr.errors import LlmattrError
from llmattr.methods.logit import classifier_attributions
from llmattr.models.probe import eager_attention
from llmattr.request import Request

TEXT = "An engrossing film that is never boring."


def gen_target(lm, n=3):
    return prepare(lm, TEXT, Request("generate", answer=" the quick fox"[: 4 * n]))


def test_logat_is_the_models_own_logit_at_every_position(tiny_lm):
    """LogAt(x_i) for step t = the causal LM's logit of y_t at position i (HoT applied to x_i^L)."""
    target = gen_target(tiny_lm)
    a, b = target.span
    raw = methods.get("logat").attribute(tiny_lm, target)
    with torch.no_grad():
        logits = tiny_lm.model(target.input_ids.to(tiny_lm.device)).logits[0, a:b]  # (n, V)
    expected = logits[:, target.target_ids].T
    torch.testing.assert_close(raw, expected, rtol=1e-4, atol=1e-5)


def test_logat_with_a_hand_set_head(tiny_tokenizer):
    """Head row of y = 2 e_0 (bias 0): LogAt(x_i) = 2 * norm(h_i^L)[0]; layer=0 reads block 0's output."""
    lm = build_tiny("llama", tiny_tokenizer, tie_word_embeddings=False)
    target = gen_target(lm, n=1)
    y = int(target.target_ids[0])
    head = lm.model.get_output_embeddings()
    head.weight.data[y] = 0.0
    head.weight.data[y, 0] = 2.0
    a, b = target.span
    with torch.no_grad():
        hidden = lm.model(target.input_ids.to(lm.device), output_hidden_states=True).hidden_states
    final = hidden[-1][0, a:b]  # transformers returns the last state after the final norm
    torch.testing.assert_close(methods.get("logat").attribute(lm, target)[0], 2.0 * final[:, 0])
    block0 = lm.model.model.norm(hidden[1][0, a:b])
    torch.testing.assert_close(methods.get("logat", layer=0).attribute(lm, target)[0], 2.0 * block0[:, 0])


def test_normxlogit_is_embedding_norm_times_logat(tiny_lm):
    target = gen_target(tiny_lm)
    a, b = target.span
    norms = tiny_lm.embed(target.input_ids)[0, a:b].norm(dim=-1)
    logat = methods.get("logat").attribute(tiny_lm, target)
    l2 = methods.get("l2-norm").attribute(tiny_lm, target)
    torch.testing.assert_close(l2, norms.expand(target.n_steps, -1))
    torch.testing.assert_close(methods.get("normxlogit").attribute(tiny_lm, target), norms * logat.to(norms.device))
    assert methods.get("normxlogit").signed and not methods.get("l2-norm").signed


def test_gemma_soft_capping_is_part_of_the_head(tiny_tokenizer):
    lm = build_tiny("gemma3", tiny_tokenizer, final_logit_softcapping=0.05)
    target = gen_target(lm)
    a, b = target.span
    with torch.no_grad():
        logits = lm.model(target.input_ids.to(lm.device)).logits[0, a:b]
    raw = methods.get("logat").attribute(lm, target)
    assert raw.abs().max() <= 0.05
    torch.testing.assert_close(raw, logits[:, target.target_ids].T, rtol=1e-4, atol=1e-6)


def test_bad_layer_is_a_clear_error(tiny_llama):
    with pytest.raises(LlmattrError, match="layer"):
        methods.get("logat", layer=7).attribute(tiny_llama, gen_target(tiny_llama))
    with pytest.raises(LlmattrError, match="layer"):
        methods.get("normxlogit", layer="x")


@pytest.mark.parametrize("layers", ["last", "all"])
def test_attention_is_the_recorded_probabilities_averaged(tiny_lm, layers):
    target = gen_target(tiny_lm)
    a, b = target.span
    with torch.no_grad(), eager_attention():
        att = tiny_lm.model(target.input_ids.to(tiny_lm.device), output_attentions=True).attentions  # L x (1, H, S, S)
    chosen = att if layers == "all" else att[-1:]
    expected = torch.stack([x[0][:, target.positions, a:b] for x in chosen]).mean(dim=(0, 1))
    torch.testing.assert_close(methods.get("attention", layers=layers).attribute(tiny_lm, target), expected)


def test_attention_hand_check(tiny_tokenizer):
    """One layer: softmax(q k^T / sqrt(d)) recomputed from the recorded q and k, mean over heads."""
    from llmattr.models.probe import Probe

    lm = build_tiny("llama", tiny_tokenizer, num_hidden_layers=1)
    target = gen_target(lm, n=1)
    with torch.no_grad(), Probe(record=True) as probe:
        lm.model(target.input_ids.to(lm.device))
    rec = probe.layers[0]
    t = int(target.positions[0])
    scores = torch.einsum("hd,hsd->hs", rec.q[0, :, t], rec.keys()[0, :, : t + 1]) / rec.q.shape[-1] ** 0.5
    expected = torch.softmax(scores, -1).mean(0)[target.span[0]:target.span[1]]
    torch.testing.assert_close(methods.get("attention").attribute(lm, target)[0], expected)


def tiny_classifier(kind: str, tokenizer, num_labels: int):
    from transformers import AutoModelForSequenceClassification, BertConfig, LlamaConfig

    torch.manual_seed(0)
    if kind == "bert":
        cfg = BertConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                         intermediate_size=64, max_position_embeddings=128, num_labels=num_labels)
    else:
        cfg = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, num_labels=num_labels, pad_token_id=2)
    return AutoModelForSequenceClassification.from_config(cfg).eval()


@pytest.mark.parametrize("kind,cls_index", [("bert", 0), ("llama", -1)])
def test_classifier_logat_reproduces_the_prediction_at_the_pooled_token(tiny_tokenizer, kind, cls_index):
    """HoT applied to the pooled token's representation is the model's own output (eq. 2)."""
    model = tiny_classifier(kind, tiny_tokenizer, num_labels=3)
    out = classifier_attributions(model, tiny_tokenizer, TEXT, method="logat")
    assert out.label == int(torch.tensor(out.prediction).argmax())
    assert len(out.scores) == len(out.tokens)
    assert out.scores[cls_index] == pytest.approx(out.prediction[out.label], rel=1e-4, abs=1e-6)
    other = classifier_attributions(model, tiny_tokenizer, TEXT, label=(out.label + 1) % 3, method="logat")
    assert other.scores[cls_index] == pytest.approx(out.prediction[(out.label + 1) % 3], rel=1e-4, abs=1e-6)
    norm = classifier_attributions(model, tiny_tokenizer, TEXT, method="l2-norm").scores
    nxl = classifier_attributions(model, tiny_tokenizer, TEXT, method="normxlogit").scores
    torch.testing.assert_close(torch.tensor(nxl), torch.tensor(norm) * torch.tensor(out.scores))


@pytest.mark.parametrize("kind,cls_index", [("bert", 0), ("llama", -1)])
def test_classifier_regression_form(tiny_tokenizer, kind, cls_index):
    """|HoT(x_i) - HoT(cls)| (eq. 3): zero at the pooled token, HoT(x_i) recovered up to sign."""
    model = tiny_classifier(kind, tiny_tokenizer, num_labels=1)
    out = classifier_attributions(model, tiny_tokenizer, TEXT, method="logat")
    assert out.label is None
    assert out.scores[cls_index] == pytest.approx(0.0, abs=1e-6)
    assert min(out.scores) >= 0.0
    with pytest.raises(LlmattrError, match="label"):
        classifier_attributions(tiny_classifier(kind, tiny_tokenizer, 2), tiny_tokenizer, TEXT, label=5,
                                method="logat")


def test_classifier_rejects_a_causal_lm(tiny_llama):
    with pytest.raises(LlmattrError, match="classification head"):
        classifier_attributions(tiny_llama.model, tiny_llama.tokenizer, TEXT)


def test_methods_cli_lists_every_method():
    from typer.testing import CliRunner

    from llmattr.cli.app import app

    result = CliRunner().invoke(app, ["methods"], env={"COLUMNS": "250"})
    assert result.exit_code == 0, result.output
    for name in methods.available():
        assert name in result.output
    assert "gradients" in result.output and "signed" in result.output


def test_encoder_normxlogit_reads_the_embedding_layer_output_and_token_types(tiny_tokenizer):
    """Paper 003's code: ||hidden_states[0]|| (word + position + token-type embeddings, LayerNorm) by default;
    the raw word-embedding row as an option; a sentence pair's token_type_ids reach every forward."""
    from llmattr.methods.logit import classification_head, classifier_scores

    model = tiny_classifier("bert", tiny_tokenizer, num_labels=2)
    ids = torch.tensor([tiny_tokenizer("the quick brown fox jumps")["input_ids"]])
    types = (torch.arange(ids.shape[1]) >= 2).long()[None]  # the second "sentence" from token 2 on
    with torch.no_grad():
        emb = model.bert.embeddings(input_ids=ids, token_type_ids=types)[0].norm(dim=-1)
        word = model.bert.embeddings.word_embeddings(ids)[0].norm(dim=-1)
        hot, _ = classification_head(model)
        logat = hot(model.bert(input_ids=ids, token_type_ids=types).last_hidden_state[0])[:, 1]
    hidden, _, _ = classifier_scores(model, ids, 1, "normxlogit", token_type_ids=types)
    torch.testing.assert_close(hidden, emb * logat)
    raw, _, _ = classifier_scores(model, ids, 1, "normxlogit", embedding="word", token_type_ids=types)
    torch.testing.assert_close(raw, word * logat)
    assert not torch.allclose(hidden, raw, rtol=0.05)
    untyped, _, _ = classifier_scores(model, ids, 1, "logat")
    assert not torch.allclose(untyped, logat, rtol=1e-3)  # token types change LogAt on a pair

    class PairTokenizer:  # the tiny tokenizer has no pair template: mark the pair's tokens as type 1
        def __call__(self, text, text_pair=None, **kwargs):
            first = tiny_tokenizer(text, return_tensors="pt")["input_ids"]
            second = tiny_tokenizer(text_pair, return_tensors="pt")["input_ids"]
            zeros, ones = torch.zeros_like(first), torch.ones_like(second)
            return {"input_ids": torch.cat([first, second], 1), "token_type_ids": torch.cat([zeros, ones], 1)}

        def decode(self, ids):
            return tiny_tokenizer.decode(ids)

    out = classifier_attributions(model, PairTokenizer(), "the quick", text_pair=" brown fox jumps", label=1,
                                  method="logat")
    first = len(tiny_tokenizer("the quick")["input_ids"])
    pair_ids = torch.tensor([tiny_tokenizer("the quick")["input_ids"]
                             + tiny_tokenizer(" brown fox jumps")["input_ids"]])
    pair_types = (torch.arange(pair_ids.shape[1]) >= first).long()[None]
    expected, _, _ = classifier_scores(model, pair_ids, 1, "logat", token_type_ids=pair_types)
    torch.testing.assert_close(torch.tensor(out.scores), expected)
