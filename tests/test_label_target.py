"""The label-word target of classification tasks: what is explained and what the Explanation records."""

from __future__ import annotations

import json

import pytest
import torch

import llmattr
from conftest import build_tiny
from llmattr.api import prepare
from llmattr.errors import LlmattrError
from llmattr.prompting import build_prompt
from llmattr.request import Request
from llmattr.targets import generate
from llmattr.tasks import Task, get_task

TEXT = "An engrossing film that is never boring."


def pos_the(**kwargs) -> Task:
    """Two label words that are single tokens of the tiny tokenizer (``Negative`` is two)."""
    return Task(name="pos-the", user_template="Text: {text}", fields=("text",), kind="classification",
                label_words=("Positive", "the"), max_new_tokens=3, **kwargs)


def first_answer_logits(lm, task, example) -> torch.Tensor:
    with torch.no_grad():
        ids = build_prompt(lm.tokenizer, task, example).input_ids.to(lm.device)
        return lm.model(input_ids=ids).logits[0, -1].double()


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_default_target_is_the_argmax_over_the_label_words(tiny_tokenizer, seed):
    lm = build_tiny("llama", tiny_tokenizer, seed=seed)
    task = pos_the()
    target = prepare(lm, {"text": TEXT, "label": "the"}, Request(task))
    logits = first_answer_logits(lm, task, {"text": TEXT})
    ids = task.label_ids(tiny_tokenizer)
    best = int(logits[ids].argmax())
    assert target.target_ids.tolist() == [int(ids[best])] and not target.forced
    record = target.classification
    free = generate(lm, target.prompt, task.max_new_tokens)
    assert record["free_answer"] == tiny_tokenizer.decode(free.tolist())
    assert record["began_with_label"] == (int(free[0]) in ids.tolist())
    probs = torch.softmax(logits, -1)[ids]
    assert record["label_probs"] == pytest.approx(dict(zip(task.label_words, probs.tolist(), strict=True)),
                                                  rel=1e-5)
    assert record["predicted"] == task.label_words[best] and record["gold"] == "the"
    assert record["correct"] == (best == 1) and record["target"] == "label"


def test_generated_and_gold_targets(tiny_llama, tiny_tokenizer):
    task = pos_the()
    generated = prepare(tiny_llama, TEXT, Request(task, target="generated"))
    assert generated.target_ids.tolist() == generate(tiny_llama, generated.prompt, 3).tolist()
    assert generated.classification["gold"] is None and generated.classification["correct"] is None
    for gold in task.label_words:
        target = prepare(tiny_llama, TEXT, Request(task, target="gold", gold=gold))
        assert target.target_ids.tolist() == task.word_ids(tiny_tokenizer, [gold]).tolist()
        assert target.classification["gold"] == gold
    with pytest.raises(LlmattrError, match="target='gold' needs the gold label"):
        prepare(tiny_llama, TEXT, Request(task, target="gold"))
    with pytest.raises(LlmattrError, match="target must be one of"):
        prepare(tiny_llama, TEXT, Request(task, target="free"))


def test_explanation_records_the_classification_and_round_trips(tiny_llama):
    expl = llmattr.explain({"text": TEXT, "label": "Positive"}, model=tiny_llama, method="random", task=pos_the())
    record = expl.classification
    assert expl.steps[0].token == record["predicted"] and expl.generated == record["predicted"]
    assert set(record) == {"target", "free_answer", "began_with_label", "label_probs", "predicted", "gold",
                           "correct"}
    assert llmattr.Explanation.from_json(expl.to_json()).classification == record
    assert not llmattr.explain("a generation", model=tiny_llama, method="random", task="generate").classification


def test_a_multi_token_label_word_is_refused(tiny_llama, tiny_tokenizer, monkeypatch):
    """BoolQ's 'true' is three tokens of the tiny tokenizer: refused, also with first_token=True (the
    label-word target explains the word's own token, never its first piece), and by the CLI in one line."""
    from dataclasses import replace

    from typer.testing import CliRunner

    from llmattr.cli import app

    boolq = get_task("boolq")
    example = {"passage": TEXT, "question": "is it boring?"}
    for task in (boolq, replace(boolq, first_token=True)):
        for mode in ("label", "generated"):
            with pytest.raises(LlmattrError, match="'true' is 3 tokens"):
                prepare(tiny_llama, example, Request(task, target=mode))
    assert prepare(tiny_llama, example, Request(boolq, answer=" movie")).forced  # a forced answer is explained as given
    monkeypatch.setattr("llmattr.models.loading.load_model", lambda *args, **kwargs: tiny_llama)
    result = CliRunner().invoke(app, ["explain", TEXT, "--task", "boolq", "--field", "question=is it?"])
    assert isinstance(result.exception, LlmattrError) and "'true' is 3 tokens" in str(result.exception)


def test_cli_rejects_an_unknown_target_before_loading(monkeypatch):
    from typer.testing import CliRunner

    from llmattr.cli import app

    monkeypatch.setattr("llmattr.models.loading.load_model", lambda *a, **k: pytest.fail("model loaded"))
    result = CliRunner().invoke(app, ["explain", TEXT, "--target", "free"])
    assert isinstance(result.exception, LlmattrError) and "target must be one of" in str(result.exception)


@pytest.mark.slow
def test_boolq_explains_true_or_false_on_the_embedded_model(smollm, shared_data, tmp_path, monkeypatch):
    """The issue's acceptance command: a BoolQ passage explains `true` or `false`, and the JSON records the
    free answer and the label-word probabilities."""
    from typer.testing import CliRunner

    from llmattr.cli import app

    row = json.loads((shared_data / "boolq.jsonl").read_text().splitlines()[0])
    monkeypatch.setattr("llmattr.models.loading.load_model", lambda *args, **kwargs: smollm)
    out = tmp_path / "out.json"
    result = CliRunner().invoke(app, ["explain", row["passage"][:600], "--task", "boolq", "--field",
                                      f"question={row['question']}", "--json", str(out)])
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())
    assert [s["token"] for s in data["steps"]] in (["true"], ["false"])
    record = data["classification"]
    assert set(record["label_probs"]) == {"true", "false"} and isinstance(record["free_answer"], str)
    assert record["predicted"] == data["steps"][0]["token"] and "free answer" in result.output


def test_report_shows_the_task_accuracy_per_dataset(tmp_path):
    """One vote per example (every method explains the same target): sst2 2 of 3 correct, boolq 0 of 1;
    examples without a gold label do not count."""
    from llmattr.api import catalog
    from llmattr.explanation import Explanation, Step
    from llmattr.report.layouts import accuracy_table
    from llmattr.report.writers import to_markdown
    from llmattr.store import MetricOutput, Results, Row, Store, Unit, canonical

    def stored(correct):
        record = {"target": "label", "predicted": "Positive", "gold": None if correct is None else "Positive",
                  "correct": correct}
        step = Step(token="Positive", token_id=9, raw=[0.5], scores=[0.5], position=1)
        return Explanation(model="tiny", method="m", params={}, tokens=["<s>", "a"], token_ids=[0, 1], span=(1, 2),
                           steps=[step], classification=record).to_json()

    votes = {("sst2", "a"): True, ("sst2", "b"): True, ("sst2", "c"): False, ("sst2", "d"): None,
             ("boolq", "e"): False}
    with Store(tmp_path / "r.sqlite") as store:
        store.check_settings("tiny", {"seed": 0})
        for (dataset, example), correct in votes.items():
            for method in ("random", "grad-ellm"):
                store.write(Unit("tiny", dataset, example, method, canonical({})), stored(correct), 0.1,
                            [MetricOutput("soft", "dynamic", 0.1, [Row("soft_ns", 0.5)])])
    table = accuracy_table(Results([tmp_path / "r.sqlite"], datasets=catalog().datasets), "tiny")  # display names
    assert table.columns == ["SST2", "BoolQ"]
    (_, accuracy), (_, counts) = table.sections[0].rows
    assert [c.value for c in accuracy] == pytest.approx([2 / 3, 0.0]) and [c.value for c in counts] == [3, 1]
    assert "0.667" in to_markdown(table)


@pytest.mark.parametrize("mode", ["label", "generated", "gold"])
def test_step_probabilities_come_from_the_generation_without_a_second_pass(tiny_llama, mode):
    """explain's step probabilities are read off the generation that picked the target (the random method runs
    no model, so explain runs exactly the passes of prepare) and equal a separate forward's."""
    task, example = pos_the(), {"text": TEXT, "label": "the"}
    calls = []
    hook = tiny_llama.model.register_forward_pre_hook(lambda module, args: calls.append(1))
    try:
        target = prepare(tiny_llama, example, Request(task, target=mode))
        passes = len(calls)
        expl = llmattr.explain(example, model=tiny_llama, method="random", task=task, target=mode)
    finally:
        hook.remove()
    assert len(calls) == 2 * passes
    with torch.no_grad():
        logits = tiny_llama.model(input_ids=target.input_ids.to(tiny_llama.device)).logits[0, target.positions].cpu()
    expected = logits.softmax(-1).gather(-1, target.target_ids[:, None])[:, 0]
    torch.testing.assert_close(torch.tensor([s.prob for s in expl.steps]), expected, rtol=1e-5, atol=1e-7)
