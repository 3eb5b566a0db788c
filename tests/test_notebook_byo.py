"""Notebook views, the batch API, API misuse, and bring-your-own scores (from_scores, Captum, Inseq)."""

import json
import re
import warnings
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

import llmattr
from conftest import build_tiny
from llmattr import api
from llmattr.cli import app
from llmattr.converters import from_captum, from_inseq
from llmattr.errors import LlmattrError, NotExplainedWarning
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
    import pandas  # in requirements-dev.txt: this test runs in `make test`, never skips
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


def test_batch_checks_every_item_before_the_model_loads(monkeypatch):
    loads = []
    monkeypatch.setattr(api, "load_model", lambda *a, **k: loads.append(a))
    api._cached_model.cache_clear()
    with pytest.raises(LlmattrError, match=r"item 1: empty text.*; item 3: text must be a str") as err:
        llmattr.explain(["A fine film.", "  ", "Dull.", None], model="never-loaded", progress=False)
    assert "item 0" not in str(err.value) and "item 2" not in str(err.value) and loads == []
    api._cached_model.cache_clear()


def test_batch_keeps_the_good_results_and_names_the_bad_items(tiny_llama, monkeypatch):
    prepare = api.prepare

    def failing(lm, text, *args, **kwargs):
        if text == "Too long.":
            raise LlmattrError("the prompt is longer than the model's context")
        return prepare(lm, text, *args, **kwargs)

    monkeypatch.setattr(api, "prepare", failing)
    with pytest.warns(NotExplainedWarning, match=r"1 of 3 item\(s\) not explained.*item 1: the prompt is longer"):
        out = llmattr.explain(["A fine film.", "Too long.", "Boring."], model=tiny_llama, method="random",
                              progress=False)
    assert isinstance(out, llmattr.Explanations) and isinstance(out, list)
    assert len(out) == 2 and out.examples == [0, 2] and list(out.failed) == [1]
    assert "Boring." in out[1].text and "item 1 not explained" in out._repr_html_()


def refuse_saliency(monkeypatch) -> None:
    """Make :func:`api.attribute` refuse saliency as the memory guard would, and run every other method."""
    attribute = api.attribute

    def failing(lm, target, method, *args, **kwargs):
        if method.name == "saliency":
            raise LlmattrError("would not fit in memory")
        return attribute(lm, target, method, *args, **kwargs)

    monkeypatch.setattr(api, "attribute", failing)


def test_a_method_that_fails_on_a_text_keeps_the_other_methods(tiny_llama, monkeypatch):
    refuse_saliency(monkeypatch)
    with pytest.warns(UserWarning, match="item 0: saliency: would not fit in memory"):
        out = llmattr.explain("A fine film.", model=tiny_llama, method=["random", "saliency", "attention"])
    assert [e.method for e in out] == ["random", "attention"] and out.failed == {0: "saliency: would not fit in "
                                                                                 "memory"}


def test_methods_side_by_side_one_generation(tiny_llama, generated, monkeypatch):
    calls = []
    prepare = api.prepare
    monkeypatch.setattr(api, "prepare", lambda *a, **k: calls.append(a[1]) or prepare(*a, **k))
    both = llmattr.explain(TEXT, model=tiny_llama, method=["input-x-gradient", "saliency", "random"],
                           task="generate", answer=ANSWER)
    assert calls == [TEXT] and [e.method for e in both] == ["input-x-gradient", "saliency", "random"]
    np.testing.assert_array_equal(both[0].to_numpy(raw=True), generated.to_numpy(raw=True))
    assert both[1].span_display == both[0].span_display and both.examples == [0, 0, 0]
    page = both._repr_html_()
    assert page.count('<table class="grid">') == 1 and page.count("<tr><td><b>") == 3 * len(generated.steps)
    results = llmattr.evaluate(both, tiny_llama, samples=2, seed=3, pis=PIS, progress=False)
    assert len(results) == 3
    metrics = results[0].to_dict()["metrics"]
    assert (metrics["pi_soft_ns"]["auc"], metrics["pi_soft_nc"]["auc"]) == aucs(generated, tiny_llama)
    frame = both.to_pandas()
    assert sorted(set(frame.method)) == ["input-x-gradient", "random", "saliency"]
    assert set(frame.example) == {0} and set(frame.model) == {tiny_llama.model_id}


def test_tokens_gives_the_columns_from_scores_takes(tiny_llama, generated):
    tokens = llmattr.tokens(TEXT, model=tiny_llama, task="generate")
    assert tokens == generated.span_display
    expl = llmattr.from_scores(TEXT, np.arange(len(tokens), dtype=float)[None], model=tiny_llama, task="generate")
    assert expl.span_display == tokens and expl.steps[0].raw == [float(i) for i in range(len(tokens))]


def test_docs_bring_your_own_scores_runs_as_written(tiny_llama, monkeypatch):
    """The python block of docs/notebooks.md's "Bring your own scores", run as written (model "default"
    stands for the tiny model here)."""
    from pathlib import Path

    doc = (Path(__file__).parents[1] / "docs" / "notebooks.md").read_text(encoding="utf-8")
    section = doc.split("## Bring your own scores", 1)[1]
    block = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    monkeypatch.setattr(api, "resolve_model", lambda model, *a, **k: tiny_llama)
    scope = {"llmattr": llmattr}
    exec(compile(block, "docs/notebooks.md", "exec"), scope)
    assert isinstance(scope["expl"], Explanation)


def test_evaluate_scores_keeps_the_good_records_and_names_the_bad(tiny_llama, generated, tmp_path, monkeypatch):
    m = generated.span[1] - generated.span[0]
    good = {"text": TEXT, "scores": generated.to_numpy(raw=True).tolist(), "task": "generate", "answer": ANSWER,
            "signed": True, "method": "input-x-gradient"}
    records = [good, {**good, "scores": [[1.0] * (m + 3)]}, good]
    (tmp_path / "scores.json").write_text(json.dumps(records))
    monkeypatch.setattr(api, "resolve_model", lambda *a, **k: tiny_llama)
    run = CliRunner().invoke(app, ["evaluate-scores", str(tmp_path / "scores.json"), "--samples", "1",
                                   "--json", str(tmp_path / "out.json")])
    assert isinstance(run.exception, LlmattrError)  # `llmattr` prints it as one line and exits 2
    assert str(run.exception).startswith("1 of 3 record(s) not evaluated (record 1;")
    assert "1: not evaluated: scores have shape (1, " in run.output
    out = json.loads((tmp_path / "out.json").read_text())
    assert [r["record"] for r in out] == [0, 1, 2]
    assert out[0]["metrics"] == out[2]["metrics"] and f"x {m} content tokens" in out[1]["error"]


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
    import inseq  # requirements-dev.txt (installed --no-deps by `make setup`): runs in `make test`
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


def test_cli_explain_methods_side_by_side(tiny_llama, tmp_path, monkeypatch):
    monkeypatch.setattr("llmattr.models.loading.load_model", lambda *a, **k: tiny_llama)
    page, data = tmp_path / "grid.html", tmp_path / "out.json"
    run = CliRunner().invoke(app, ["explain", TEXT, "--method", "input-x-gradient,random", "--task", "generate",
                                   "--answer", ANSWER, "--html", str(page), "--json", str(data)])
    assert run.exit_code == 0, run.output
    records = json.loads(data.read_text())
    assert [r["method"] for r in records] == ["input-x-gradient", "random"]
    assert records[0]["steps"][0]["token_id"] == records[1]["steps"][0]["token_id"]  # one generation
    html = page.read_text(encoding="utf-8")
    assert html.count('<table class="grid">') == 1 and html.count("<tr><td><b>") == 2 * len(records[0]["steps"])
    refused = CliRunner().invoke(app, ["explain", TEXT, "--method", "random,saliency", "--figure",
                                       str(tmp_path / "m.png")])
    assert isinstance(refused.exception, LlmattrError) and "--figure draws one method" in str(refused.exception)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["grid.html", "out.json"]


def test_cli_explain_side_by_side_names_the_refused_methods(tiny_llama, tmp_path, monkeypatch):
    """One text, several methods: one refused -> the others written, the refused one named in the error line;
    every one refused -> that one line and no file written (it used to fail with an IndexError)."""
    monkeypatch.setattr("llmattr.models.loading.load_model", lambda *a, **k: tiny_llama)
    refuse_saliency(monkeypatch)
    data = tmp_path / "out.json"
    args = ["explain", TEXT, "--task", "generate", "--answer", ANSWER, "--json", str(data), "--method"]
    with warnings.catch_warnings():  # the API's warning is not printed before the command's own error line
        warnings.simplefilter("error")
        partial = CliRunner().invoke(app, [*args, "saliency,random"])
    assert isinstance(partial.exception, LlmattrError)
    assert str(partial.exception) == "not explained: saliency: would not fit in memory"
    assert [r["method"] for r in json.loads(data.read_text())] == ["random"]
    data.unlink()
    monkeypatch.setenv("LLMATTR_MEMORY_LIMIT", "1KB")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        refused = CliRunner().invoke(app, [*args, "saliency,random"])
    assert isinstance(refused.exception, LlmattrError)
    message = str(refused.exception)
    assert message.startswith("not explained: no method fits in memory: saliency on") and "; random on" in message
    assert "\n" not in message and not data.exists()
