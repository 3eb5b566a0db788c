"""Notebook views, the batch API, API misuse, and bring-your-own scores (from_scores, Captum, Inseq)."""

import json
import re
from types import SimpleNamespace

import numpy as np
import pytest
import torch

import llmattr
from conftest import build_tiny
from llmattr import api
from llmattr.converters import from_captum, from_inseq
from llmattr.errors import LlmattrError
from llmattr.explanation import Explanation

TEXT = "An engrossing film that is never boring."
ANSWER = " it was fine"
PIS = (0.25, 0.5, 0.75)


@pytest.fixture
def generated(tiny_llama):
    return llmattr.explain(TEXT, model=tiny_llama, method="input-x-gradient", task="generate", answer=ANSWER)


def aucs(expl, lm):
    metrics = llmattr.evaluate(expl, lm, samples=2, seed=3, pis=PIS).to_dict()["metrics"]
    return metrics["pi_soft_ns"]["auc"], metrics["pi_soft_nc"]["auc"]


def test_repr_html_and_pandas_and_numpy(generated):
    page = generated._repr_html_()
    cells = re.findall(r'<span class="tok"[^>]*>([^<]*)<', page)
    shown = [t.replace("\n", "\u21b5") for t in generated.span_display]
    assert cells == shown * len(generated.steps)  # every token, in order, on every step's row
    assert page.count("<tr><td>") == len(generated.steps)
    np.testing.assert_array_equal(generated.to_numpy(raw=True), np.array([s.raw for s in generated.steps]))
    pandas = pytest.importorskip("pandas")
    frame = generated.to_pandas()
    n, m = len(generated.steps), generated.span[1] - generated.span[0]
    assert list(frame.columns) == ["step", "target", "token", "position", "raw", "score"]
    assert len(frame) == n * m and not frame.duplicated(["step", "position"]).any()
    row = frame[(frame.step == n - 1) & (frame.position == generated.span[0] + 1)].iloc[0]
    assert row.raw == generated.steps[-1].raw[1] and row.score == generated.steps[-1].scores[1]
    assert isinstance(frame, pandas.DataFrame)


def test_show_outside_a_notebook_prints_the_heatmap(generated, capsys):
    generated.show(numbers=True)
    out = capsys.readouterr().out
    assert generated.method in out and f"[{llmattr.render.number(generated.steps[0].raw[0])}]" in out


def test_batch_explains_a_list_with_one_model_load(tiny_llama, monkeypatch):
    loads = []
    monkeypatch.setattr(api, "load_model", lambda *a, **k: loads.append(a) or tiny_llama)
    api._cached_model.cache_clear()
    out = llmattr.explain(["A fine film.", "A dull film.", "Boring."], model="batch-spec", method="random",
                          progress=False)
    assert [type(e) for e in out] == [Explanation] * 3 and len(loads) == 1
    assert out[1].text.count("A dull film.") == 1
    api._cached_model.cache_clear()


def test_shots_from_a_file(tiny_llama, tmp_path):
    demos = tmp_path / "demos.jsonl"
    demos.write_text("\n".join(json.dumps({"text": t, "label": label}) for t, label in
                               [("Loved every minute.", "positive"), ("A waste of time.", "negative")]))
    expl = llmattr.explain("A fine film.", model=tiny_llama, method="random", shots=2, shots_from=str(demos))
    a, b = expl.span
    assert "Loved every minute." in expl.text and "A waste of time." in expl.text
    assert expl.text.index("A waste of time.") < expl.offsets[a][0]  # before the content span, never in it
    assert "".join(expl.span_display).strip() == "A fine film."


def test_step_probabilities_and_load_time(generated, tiny_llama):
    target = llmattr.faithfulness.target_from_explanation(generated)
    with torch.no_grad():
        logits = tiny_llama.model(input_ids=target.input_ids.to(tiny_llama.device)).logits[0, target.positions]
    expected = logits.softmax(-1).cpu().gather(-1, target.target_ids[:, None])[:, 0]
    torch.testing.assert_close(torch.tensor([s.prob for s in generated.steps]), expected,
                               rtol=1e-5, atol=1e-7)
    assert generated.timings["load_s"] == 0.0  # a model built in memory took no load


def test_api_misuse_is_refused(tiny_llama, generated, tmp_path):
    for bad in (None, 3, b"bytes"):
        with pytest.raises(LlmattrError, match="text must be a str"):
            llmattr.explain(bad, model=tiny_llama)
    with pytest.raises(LlmattrError, match="samples must be a whole number"):
        llmattr.evaluate(generated, tiny_llama, samples=2.5)
    with pytest.raises(LlmattrError, match="evaluate\\(\\) takes an Explanation"):
        llmattr.evaluate(generated.to_dict(), tiny_llama)
    for content in ("not json", "[1, 2]", json.dumps({"model": "m"})):
        (tmp_path / "bad.json").write_text(content)
        with pytest.raises(LlmattrError, match="not an llmattr Explanation JSON"):
            Explanation.from_json(tmp_path / "bad.json")
    with pytest.raises(LlmattrError, match="cannot read explanation file"):
        Explanation.from_json(tmp_path / "missing.json")


def test_explanation_of_another_tokenizer_is_refused(generated):
    from tokenizers import ByteLevelBPETokenizer
    from transformers import PreTrainedTokenizerFast

    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(["completely different words here, zebra quartz"] * 5, vocab_size=400,
                            special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"])
    other_tok = PreTrainedTokenizerFast(tokenizer_object=bpe._tokenizer, eos_token="<|im_end|>")
    other = build_tiny("llama", other_tok)
    with pytest.raises(LlmattrError, match="tokens are not tiny-llama's"):
        llmattr.evaluate(generated, other)


def test_from_scores_round_trip_gives_the_same_aucs(generated, tiny_llama):
    """Plain numpy scores through from_scores = the same scores produced inside llmattr."""
    raw = generated.to_numpy(raw=True)
    given = llmattr.from_scores(TEXT, raw, model=tiny_llama, task="generate", method=generated.method,
                                    signed=True, answer=ANSWER)
    assert given.token_ids == generated.token_ids and [s.token_id for s in given.steps] == \
        [s.token_id for s in generated.steps]
    np.testing.assert_array_equal(given.to_numpy(), generated.to_numpy())
    assert aucs(given, tiny_llama) == aucs(generated, tiny_llama)
    m = generated.span[1] - generated.span[0]
    with pytest.raises(LlmattrError, match=f"x {m} content tokens"):
        llmattr.from_scores(TEXT, raw[:, :-1], model=tiny_llama, task="generate", answer=ANSWER)
    one = llmattr.from_scores(TEXT, list(range(m)), model=tiny_llama, task="generate")
    assert len(one.steps) == 1 and one.steps[0].raw == [float(i) for i in range(m)]


def test_captum_result_converts_to_the_same_aucs(generated, tiny_llama):
    from captum.attr import FeatureAblation, LLMAttribution, TextTokenInput

    tok = tiny_llama.tokenizer
    llm_attr = LLMAttribution(FeatureAblation(tiny_llama.model), tok)
    result = llm_attr.attribute(TextTokenInput(generated.text, tok), target=ANSWER)
    expl = from_captum(result, TEXT, ANSWER, model=tiny_llama, task="generate", method=generated.method, signed=True)
    a, b = generated.span
    start = [k for k in range(len(result.input_tokens))
             if result.input_tokens[k: k + b - a] == tok.convert_ids_to_tokens(generated.span_ids)][-1]
    columns = np.asarray(result.token_attr.cpu(), dtype=np.float64)[:, start: start + b - a]
    np.testing.assert_array_equal(expl.to_numpy(raw=True), columns)
    same = llmattr.from_scores(TEXT, columns, model=tiny_llama, task="generate", method=generated.method,
                                   signed=True, answer=generated.generated)
    assert aucs(expl, tiny_llama) == aucs(same, tiny_llama)


def inseq_like(expl, scores):
    """An Inseq 0.7 FeatureAttributionOutput of a decoder-only model, as inseq lays it out (duck-typed)."""
    ids = expl.token_ids + [s.token_id for s in expl.steps]
    p, n = len(expl.token_ids), len(expl.steps)
    matrix = np.full((len(ids), n), np.nan)
    for t in range(n):
        matrix[: p + t, t] = np.random.default_rng(t).normal(size=p + t)  # prompt + generated prefix
        matrix[expl.span[0]: expl.span[1], t] = scores[t]
    seq = SimpleNamespace(target=[SimpleNamespace(id=i, token=str(i)) for i in ids], source=None,
                          source_attributions=None, target_attributions=torch.tensor(matrix),
                          attr_pos_start=p, attr_pos_end=p + n)
    return SimpleNamespace(sequence_attributions=[seq])


def test_inseq_layout_converts_to_the_same_aucs(generated, tiny_llama):
    raw = generated.to_numpy(raw=True)
    expl = from_inseq(inseq_like(generated, raw), TEXT, model=tiny_llama, task="generate",
                      method=generated.method, signed=True)
    np.testing.assert_array_equal(expl.to_numpy(raw=True), raw)
    assert aucs(expl, tiny_llama) == aucs(generated, tiny_llama)


def test_real_inseq_output_converts(generated, tiny_llama):
    inseq = pytest.importorskip("inseq")
    model = inseq.load_model(tiny_llama.model, "input_x_gradient", tokenizer=tiny_llama.tokenizer)
    out = model.attribute(generated.text, generated.text + generated.generated, show_progress=False,
                          skip_special_tokens=False)
    out = out.aggregate()
    seq = out.sequence_attributions[0]
    expl = from_inseq(out, TEXT, model=tiny_llama, task="generate", method="inseq-ixg", signed=True)
    columns = seq.target_attributions.T.nan_to_num(0.0)[:, expl.span[0]: expl.span[1]]
    np.testing.assert_allclose(expl.to_numpy(raw=True), columns.double().numpy())
    same = llmattr.from_scores(TEXT, columns.numpy(), model=tiny_llama, task="generate", method="inseq-ixg",
                                   signed=True, answer=generated.generated)
    assert aucs(expl, tiny_llama) == aucs(same, tiny_llama)


def test_matrix_figure_shows_the_generated_prefix_under_scope_all(tiny_llama, tmp_path):
    """scope="all" attributes the prompt and the generated prefix (as Inseq attributes the target prefix): the
    matrix figure's sources end with the generated tokens before the last one, and pandas rows cover them."""
    from llmattr.plotting import plot_matrix

    expl = llmattr.explain(TEXT, model=tiny_llama, method="input-x-gradient", task="generate", answer=ANSWER,
                           scope="all")
    n_prompt, steps = len(expl.token_ids), [s.token for s in expl.steps]
    assert expl.span[1] == n_prompt + len(steps) - 1
    assert expl.span_display[-(len(steps) - 1):] == steps[:-1]
    svg = plot_matrix(expl, tmp_path / "m.svg").read_text(encoding="utf-8")
    labels = [label.strip() for label in re.findall(r"<text[^>]*>([^<]*)</text>", svg)]
    for token in steps[:-1]:
        assert token.strip() in labels, token
