"""Explanation: JSON round-trip, the JSON keys other tools read, word-level aggregation for BPE and SentencePiece."""

import json

import numpy as np
import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

import llmattr
from llmattr.explanation import Explanation
from llmattr.prompting import tokenize_prompt

TEXT = "An engrossing film, never boring: terrific."


def _sentencepiece_like():
    """A Unigram tokenizer with the Metaspace ('▁') pre-tokenizer, as SentencePiece models use."""
    tok = Tokenizer(models.Unigram())
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    trainer = trainers.UnigramTrainer(vocab_size=60, special_tokens=["<unk>"], unk_token="<unk>")
    tok.train_from_iterator([TEXT, "film boring terrific engrossing never an"] * 3, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>")


def _expl_for(tokenizer, text=TEXT):
    prompt = tokenize_prompt(tokenizer, "Text: " + text, (6, 6 + len(text)))
    m = prompt.span[1] - prompt.span[0]
    raw = torch.arange(m, dtype=torch.float64)[None]
    ids = prompt.input_ids[0].tolist()
    return Explanation.from_raw(
        raw, False, step_tokens=["x"], step_ids=[0], positions=[len(ids) - 1], model="m", method="random",
        params={}, tokens=[tokenizer.decode([i]) for i in ids], token_ids=ids, span=prompt.span,
        text=prompt.text, offsets=prompt.offsets)


@pytest.mark.parametrize("which", ["bpe", "sentencepiece"])
def test_words_sum_subword_scores(which, tiny_tokenizer):
    tokenizer = tiny_tokenizer if which == "bpe" else _sentencepiece_like()
    expl = _expl_for(tokenizer)
    words, scores = expl.words()
    assert words == TEXT.split()
    groups = expl.word_groups()
    assert sum(len(g) for g in groups) == expl.span[1] - expl.span[0]
    assert any(len(g) > 1 for g in groups)  # some words really are split into sub-words
    expected = np.array([[float(sum(g)) for g in groups]])
    assert isinstance(scores, np.ndarray)  # numpy, like to_numpy() and every other score view
    np.testing.assert_allclose(scores, expected)


def test_json_round_trip_and_keys(tiny_llama, tmp_path):
    expl = llmattr.explain("An engrossing film that is never boring.", model=tiny_llama, task="generate",
                           max_new_tokens=3)
    path = tmp_path / "e.json"
    expl.to_json(path)
    data = json.loads(path.read_text())
    for key in ("model", "method", "params", "tokens", "token_ids", "span", "steps", "timings"):
        assert key in data
    assert len(data["tokens"]) == len(data["token_ids"])
    a, b = data["span"]
    for step in data["steps"]:
        assert {"token", "token_id", "raw", "scores"} <= set(step)
        assert len(step["scores"]) == b - a and all(0 <= s <= 1 for s in step["scores"])
    again = Explanation.from_json(path)
    assert again == expl
    assert Explanation.from_json(expl.to_json()) == expl


def test_prompt_keeps_every_token_when_pad_equals_eos(tiny_llama):
    """pad == end-of-turn (SmolLM2): nothing may be cut from the prompt or the answer."""
    tok = tiny_llama.tokenizer
    assert tok.pad_token_id == tok.convert_tokens_to_ids("<|im_end|>")
    expl = llmattr.explain("never boring", model=tiny_llama, task="sentiment", answer="Positive")
    rendered = tok.apply_chat_template(
        [{"role": "system", "content": llmattr.tasks.get_task("sentiment").system},
         {"role": "user", "content": "Text: never boring"}], tokenize=False, add_generation_prompt=True)
    assert expl.token_ids == tok(rendered, add_special_tokens=False)["input_ids"]
    assert expl.text.endswith("<|im_start|>assistant\n") and expl.text.count("<|im_end|>") == 2
    assert "".join(expl.span_tokens).strip() == "never boring"
    assert tok.decode([s.token_id for s in expl.steps]) == "Positive"
