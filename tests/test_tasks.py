"""Tasks and loaders: sample files, user files, prompts of paper 000 appendix D, BLiMP evidence, few-shot."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from llmattr.errors import LlmattrError
from llmattr.prompting import build_prompt
from llmattr.tasks import TASKS, Task, get_task, load_examples, load_split
from llmattr.tasks.datasets import few_shot

# Paper 000, appendix D (Table 3), verbatim.
APPENDIX_D_SENTIMENT = (
    "You are a helpful sentiment classifier. Please help to do the sentiment classification "
    "of the given text and respond ONLY with the single word Positive or Negative."
)
APPENDIX_D_BOOLQ = (
    "You are a factual question answering system. Determine if the given passage supports the question "
    "being true. Respond ONLY with the single word \u2019true\u2019 or \u2019false\u2019 in lowercase, "
    "without any punctuation or additional text."
)

COUNTS = {  # file lines and per-class balance documented in llmattr/data/SOURCES.md
    "imdb": (1000, {"Positive": 500, "Negative": 500}),
    "sst2": (656, {"Positive": 328, "Negative": 328}),
    "boolq": (1000, {"true": 500, "false": 500}),
    "qnli": (1000, {"yes": 500, "no": 500}),
    "stsb": (1000, None),
    "tellmewhy": (50, None),
    "wikibio": (89, None),
    **{f"blimp-{p}": (200, None) for p in ("ana", "dna", "dnaa", "darn", "rpsv")},
}


@pytest.mark.parametrize("name", sorted(COUNTS))
def test_sample_files_load(name, shared_data, monkeypatch):
    monkeypatch.setenv("LLMATTR_DATA", str(shared_data))
    task = get_task(name)
    examples = load_examples(task)
    count, balance = COUNTS[name]
    assert len(examples) == count
    assert len({ex["id"] for ex in examples}) == count
    for ex in examples[:20]:
        assert all(isinstance(ex[f], str) and ex[f].strip() for f in task.fields)
    if balance:
        assert Counter(ex["label"] for ex in examples) == balance
    if name == "stsb":
        assert all(0.0 <= ex["label"] <= 5.0 for ex in examples)
    if name.startswith("blimp"):
        assert all(ex["label"] != ex["foil"] and len(ex["evidence_words"]) == 1 for ex in examples)


def test_sampling_is_deterministic_and_balanced(shared_data, monkeypatch):
    monkeypatch.setenv("LLMATTR_DATA", str(shared_data))
    first = load_examples("sst2", n=11, seed=3)
    assert [ex["id"] for ex in first] == [ex["id"] for ex in load_examples("sst2", n=11, seed=3)]
    assert [ex["id"] for ex in first] != [ex["id"] for ex in load_examples("sst2", n=11, seed=4)]
    assert Counter(ex["label"] for ex in first) == {"Positive": 6, "Negative": 5}
    with pytest.raises(LlmattrError, match="ask for n <="):
        load_examples("sst2", n=700)


def test_few_shot_pool_is_disjoint_and_balanced(shared_data, monkeypatch):
    monkeypatch.setenv("LLMATTR_DATA", str(shared_data))
    examples, demos = load_split("sst2", n=40, shots=4, seed=0)
    assert demos.count("Answer: Positive") == 2 and demos.count("Answer: Negative") == 2
    for ex in examples:
        assert ex["text"] not in demos
    assert demos == load_split("sst2", n=40, shots=4, seed=0)[1]
    assert few_shot("sst2", 0) == ""


def test_prompts_render_exactly_as_appendix_d(tiny_tokenizer):
    assert get_task("sentiment").system == APPENDIX_D_SENTIMENT == get_task("sst2").system
    assert get_task("imdb").system == APPENDIX_D_SENTIMENT
    assert get_task("boolq").system == APPENDIX_D_BOOLQ
    prompt = build_prompt(tiny_tokenizer, get_task("sst2"), {"text": "a gorgeous film ."})
    assert prompt.text == (f"<|im_start|>system\n{APPENDIX_D_SENTIMENT}<|im_end|>\n"
                           "<|im_start|>user\nText: a gorgeous film .<|im_end|>\n<|im_start|>assistant\n")
    fish = {"passage": "Fish swim.", "question": "do fish swim"}
    boolq = build_prompt(tiny_tokenizer, get_task("boolq"), fish)
    assert boolq.text == (f"<|im_start|>system\n{APPENDIX_D_BOOLQ}<|im_end|>\n<|im_start|>user\n"
                          "Passage: Fish swim.\n\nQuestion: do fish swim<|im_end|>\n<|im_start|>assistant\n")
    assert boolq.text[boolq.char_span[0]: boolq.char_span[1]] == "Fish swim.\n\nQuestion: do fish swim"
    story = build_prompt(tiny_tokenizer, get_task("tellmewhy"), {"text": "Tom ran. Why did Tom run?"})
    assert story.text == "<|im_start|>user\nTom ran. Why did Tom run?<|im_end|>\n<|im_start|>assistant\n"


def test_blimp_renders_raw_text(tiny_tokenizer):
    prompt = build_prompt(tiny_tokenizer, get_task("blimp-darn"), {"text": "The sister of doctors"})
    assert prompt.text == tiny_tokenizer.bos_token + "The sister of doctors"
    assert prompt.text[prompt.char_span[0]: prompt.char_span[1]] == "The sister of doctors"
    assert get_task("blimp-darn").answer_text("writes", tiny_tokenizer) == " writes"
    assert get_task("sst2").answer_text("Positive", tiny_tokenizer) == "Positive"


def _row(prefix, good, bad):
    return {"one_prefix_prefix": prefix, "one_prefix_word_good": good, "one_prefix_word_bad": bad}


@pytest.mark.parametrize("paradigm, row, evidence", [  # paper 003 Table 3, plus template variants
    ("ana", _row("This government alarms", "itself", "themselves"), "government"),
    ("ana", _row("A lot of women worry", "themselves", "herself"), "women"),
    ("dna", _row("Russell explored this", "mall", "malls"), "this"),
    ("dnaa", _row("Patients scan this orange", "brochure", "brochures"), "this"),
    ("dnaa", _row("This book isn't disturbing that out in the open", "waitress", "waitresses"), "that"),
    ("darn", _row("The sister of doctors", "writes", "write"), "sister"),
    ("darn", _row("The newspaper articles about Jesus", "resemble", "resembles"), "articles"),
    ("rpsv", _row("The pedestrian", "has", "have"), "pedestrian"),
])
def test_blimp_evidence_rules(paradigm, row, evidence):
    ex = get_task(f"blimp-{paradigm}").pair(row)
    assert ex["evidence"] == [evidence]
    assert ex["text"].split()[ex["evidence_words"][0]] == evidence


def test_blimp_shared_words_move_into_the_prefix():
    ex = get_task("blimp-dna").pair(_row("Lori hasn't returned to these", "movie theaters", "movie theater"))
    assert (ex["text"], ex["target"], ex["foil"], ex["evidence"]) == (
        "Lori hasn't returned to these movie", "theaters", "theater", ["these"])


def test_mnli_loader_and_prompt_on_a_written_file(tmp_path, tiny_tokenizer):
    rows = [{"pairID": f"p{i}", "sentence1": f"A man plays {i}.", "sentence2": "A person plays.",
             "gold_label": lab}
            for i, lab in enumerate(["entailment", "neutral", "contradiction"] * 4)]
    path = tmp_path / "mnli_dev.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows))
    columns = {"premise": "sentence1", "hypothesis": "sentence2", "label": "gold_label"}
    examples = load_examples("mnli", source=path, n=6, seed=0, columns=columns)
    assert Counter(ex["label"] for ex in examples) == {"yes": 2, "maybe": 2, "no": 2}
    prompt = build_prompt(tiny_tokenizer, get_task("mnli"), examples[0])
    assert f"Premise: {examples[0]['premise']}\n\nHypothesis: A person plays.<|im_end|>" in prompt.text
    assert "yes (entailment), maybe (neutral) or no (contradiction)" in prompt.text
    csv_path = tmp_path / "mnli.csv"
    csv_path.write_text("premise,hypothesis,label\nIt rains.,It is wet.,entailment\n"
                        "It rains.,It is dry.,contradiction\n")
    assert [ex["label"] for ex in load_examples("mnli", source=csv_path, seed=1, balanced=False)] in (
        ["yes", "no"], ["no", "yes"])
    with pytest.raises(LlmattrError, match="no column 'premise'"):
        load_examples("mnli", source=path)
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"premise": "a", "hypothesis": "b", "label": "unsure"}))
    with pytest.raises(LlmattrError, match="not one of"):
        load_examples("mnli", source=bad)


def test_hub_offline_or_missing_says_to_pass_a_file():
    with pytest.raises(LlmattrError, match="JSONL/CSV"):
        load_examples("sst2", source="hf")
    with pytest.raises(LlmattrError, match="pass a JSONL/CSV path"):
        load_examples("sst2", source="no-such-sample")


def _labels(*words, first_token=False):
    return Task(name="t", user_template="{text}", fields=("text",), kind="classification", label_words=words,
                first_token=first_token)


def test_label_words_must_be_single_tokens(tiny_tokenizer):
    # in the tiny tokenizer "Positive", "Negative" and "the" are one token, "Neg" two (281, 73), "Nega" three
    assert _labels("Positive", "the").label_ids(tiny_tokenizer).tolist() == [334, 375]
    with pytest.raises(LlmattrError, match="'Neg' is 2 tokens for this tokenizer"):
        _labels("Positive", "Neg").label_ids(tiny_tokenizer)
    assert _labels("Positive", "Neg", first_token=True).label_ids(tiny_tokenizer).tolist() == [334, 281]
    with pytest.raises(LlmattrError, match="'Neg' is 2 tokens for this tokenizer"):
        _labels("Positive", "Neg", first_token=True).label_ids(tiny_tokenizer, first_token=False)
    with pytest.raises(LlmattrError, match="share their first token"):
        _labels("Nega", "Neg", first_token=True).label_ids(tiny_tokenizer)


def test_every_task_is_registered_and_a_head_task_refuses_a_causal_lm(tiny_llama):
    for name in ("imdb", "sst2", "boolq", "tellmewhy", "wikibio", "mnli", "qnli", "stsb", "blimp-darn"):
        assert name in TASKS
        get_task(name).check_model(tiny_llama)
    with pytest.raises(LlmattrError, match="--task stsb"):
        get_task("stsb-regression").check_model(tiny_llama)


@pytest.mark.slow
@pytest.mark.parametrize("task, text", [("blimp-darn", "The sisters of Cheryl"),
                                        ("stsb", "A man is playing a guitar.")])
def test_cli_explain_paper_tasks_on_the_embedded_model(task, text, tmp_path, smollm, monkeypatch):
    from typer.testing import CliRunner

    from llmattr.cli import app

    monkeypatch.setattr("llmattr.models.loading.load_model", lambda *a, **k: smollm)
    args = ["explain", text, "--task", task, "--json", str(tmp_path / "e.json")]
    if task == "stsb":
        args += ["--field", "sentence2=A person plays an instrument.", "--shots", "2"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    saved = json.loads((tmp_path / "e.json").read_text())
    assert saved["task"] == task and len(saved["steps"]) == 1
    if task == "stsb":  # two demonstrations sit before the content span, outside it
        assert saved["text"].count("\nAnswer: ") == 2
        assert saved["text"].index("\nAnswer: ") < saved["offsets"][saved["span"][0]][0]
    bad = CliRunner().invoke(app, ["explain", text, "--task", "stsb-regression", "--field", "sentence2=x"])
    assert isinstance(bad.exception, LlmattrError) and "--task stsb," in str(bad.exception)


def test_label_predictions_batch_matches_single_prompts(tiny_llama, tiny_tokenizer):
    from llmattr.evaluation.accuracy import label_accuracy, label_predictions

    task = Task(name="pos-the", user_template="Text: {text}", fields=("text",), kind="classification",
                label_words=("Positive", "the"))
    examples = [{"text": t, "label": "the"} for t in ("a", "the quick brown fox jumps", "dull movie")]
    pred = label_predictions(tiny_llama, task, examples, batch_size=2)
    ids = task.label_ids(tiny_tokenizer)
    for ex, p in zip(examples, pred.tolist(), strict=True):
        ids_ex = build_prompt(tiny_tokenizer, task, ex).input_ids.to(tiny_llama.device)
        logits = tiny_llama.model(input_ids=ids_ex).logits[0, -1]
        assert p == int(logits[ids].argmax())
    assert label_accuracy(tiny_llama, task, examples)["n"] == 3
