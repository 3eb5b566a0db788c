"""``llmattr finetune --head``: a sequence-classification or regression head on the last token's state (paper
003's setting), trained with LoRA rank 4 by default: a separable toy task is learnt, the held-out split never meets
the training rows, an interrupted run resumes to the same weights, the folder loads as a transformers
sequence-classification model and is explained with each head task, and a head that does not fit is refused in one
line before the model loads."""

from __future__ import annotations

import json
import random
import re
from collections import defaultdict

import pytest
import torch
from safetensors.torch import load_file

import llmattr
import llmattr.faithfulness
from conftest import build_tiny
from llmattr.errors import LlmattrError
from llmattr.faithfulness.head import HEAD_METHODS, head_faithfulness
from llmattr.finetuning import FinetuneConfig, HeadCollator, finetune, head_outputs, split
from llmattr.methods.logit import classifier_scores
from llmattr.models.loading import load_model
from llmattr.tasks import get_task
from llmattr.tasks.files import read_file_examples
from test_cli_checks import NO_MODEL, one_line_error, run_cli
from test_finetune import straight_and_resumed, toy_file

FILLER = "the quick brown fox jumps over the lazy dog".split()


def toy_pairs(path, n=60, seed=0):
    """A separable STS-B-like file: the score is 5 when sentence2 repeats 'same', 0 when it says 'other'."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        same = i % 2 == 0
        rows.append({"sentence1": " ".join(rng.sample(FILLER, 3)),
                     "sentence2": " ".join(rng.sample(FILLER, 2) + ["same" if same else "other"]),
                     "score": 5.0 if same else 0.0})
    path.write_text("\n".join(json.dumps(row) for row in rows))
    return path


def head_finetune(lm, out, data, **options):
    settings = {"task": "sentiment", "data": str(data), "text_field": "review", "held_out": 20,
                "head": "classification", "learning_rate": 3e-3, "batch_size": 8, "epochs": 2, "progress": False,
                **options}
    return finetune(lm, out, **settings)


def test_a_classification_head_learns_the_toy_task_and_the_folder_loads_as_a_classifier(tiny_tokenizer, tmp_path):
    data = toy_file(tmp_path / "toy.jsonl")
    card = head_finetune(build_tiny("llama", tiny_tokenizer), tmp_path / "ft", data, epochs=12, learning_rate=1e-2)
    assert card["task"] == "sentiment-head" and card["hyperparameters"]["lora_r"] == 4  # paper 003's rank by default
    assert card["hyperparameters"]["head"] == "classification"
    assert card["held_out"]["accuracy"] >= 0.9 and card["held_out"]["majority"] == 0.5
    config = json.loads((tmp_path / "ft" / "config.json").read_text())
    assert config["architectures"] == ["LlamaForSequenceClassification"] and len(config["id2label"]) == 2
    weights = load_file(tmp_path / "ft" / "model.safetensors")
    assert "score.weight" in weights and not any("lora" in n or "modules_to_save" in n for n in weights)
    loaded = load_model(str(tmp_path / "ft"), device="cpu")
    assert type(loaded.model).__name__ == "LlamaForSequenceClassification"
    task = get_task("sentiment-head")
    task.check_model(loaded)  # the head task takes the folder
    _, examples = read_file_examples("sentiment", data, "review")
    held = [ex for ex in examples if ex["id"] in set(card["held_out_ids"])]
    pred = head_outputs(loaded.model, loaded.tokenizer, task, held, 256).argmax(-1)
    gold = torch.tensor([task.label_words.index(ex["label"]) for ex in held])
    assert (pred == gold).double().mean().item() == card["held_out"]["accuracy"]
    scores, label, _ = classifier_scores(loaded.model, torch.tensor([task.head_input_ids(loaded.tokenizer, held[0])]))
    assert label == int(pred[0]) and torch.isfinite(scores).all()


def test_a_regression_head_learns_the_toy_scores_with_full_fine_tuning(tiny_tokenizer, tmp_path):
    data = toy_pairs(tmp_path / "pairs.jsonl")
    card = finetune(build_tiny("llama", tiny_tokenizer), tmp_path / "ft", task="stsb", data=str(data),
                    head="regression", lora_r=0, held_out=20, learning_rate=3e-3, epochs=8, progress=False)
    assert card["task"] == "stsb-regression" and card["hyperparameters"]["lora_r"] == 0
    held = card["held_out"]
    assert held["pearson"] > 0.9 and held["low"] <= held["pearson"] <= held["high"]
    assert held["mse"] < held["constant_mse"]  # beats the constant predictor (training mean)
    loaded = load_model(str(tmp_path / "ft"), device="cpu")
    get_task("stsb-regression").check_model(loaded)
    assert loaded.model.config.problem_type == "regression"
    assert "held-out Pearson r |" in (tmp_path / "ft" / "README.md").read_text()


def test_the_head_held_out_split_is_unbalanced_for_scores_and_never_meets_training(tiny_tokenizer, tmp_path):
    data = toy_pairs(tmp_path / "pairs.jsonl")
    task, examples = read_file_examples("stsb-regression", data, None)
    train, held = split(task, examples, 20, 0, task.classes)
    assert task.classes == () and len(held) == 20
    assert {ex["id"] for ex in train}.isdisjoint(ex["id"] for ex in held)
    assert not {task.user_content(ex)[0] for ex in train} & {task.user_content(ex)[0] for ex in held}


def test_an_interrupted_head_run_resumes_to_the_same_weights(tiny_tokenizer, tmp_path):
    _, weights = straight_and_resumed(head_finetune, tiny_tokenizer, tmp_path, toy_file(tmp_path / "toy.jsonl"))
    assert "score.weight" in weights


def test_the_head_collator_right_pads_and_the_head_reads_the_last_real_token(tiny_tokenizer):
    batch = HeadCollator(2)([{"input_ids": [5, 6, 7], "labels": 1}, {"input_ids": [8], "labels": 0}])
    assert batch["input_ids"].tolist() == [[5, 6, 7], [8, 2, 2]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1], [1, 0, 0]] and batch["labels"].dtype == torch.long
    assert HeadCollator(2)([{"input_ids": [5], "labels": 2.5}])["labels"].dtype == torch.float32


def test_head_tasks_sit_beside_the_prompted_ones():
    for name, prompted in (("sst2-head", "sst2"), ("qnli-head", "qnli"), ("mnli-head", "mnli")):
        task, lm_task = get_task(name), get_task(prompted)
        assert task.head == "classification" and task.extra["num_labels"] == len(lm_task.label_words)
        assert task.data == lm_task.data and task.label_words == lm_task.label_words and not task.explains_label_word
    assert FinetuneConfig(task="sst2", head="classification").validate().name == "sst2-head"
    assert FinetuneConfig(task="stsb", head="regression").validate().name == "stsb-regression"
    assert FinetuneConfig(task="qnli-head", head="classification").validate().name == "qnli-head"
    assert FinetuneConfig(task="sst2").rank == 0 and FinetuneConfig(task="sst2", head="classification").rank == 4
    assert "head" not in FinetuneConfig().settings()  # a card written before --head existed still resumes
    with pytest.raises(LlmattrError, match="give --head regression"):
        FinetuneConfig(task="stsb-regression").validate()


@pytest.mark.parametrize("args, fragment", [
    (["--task", "stsb-regression"], "give --head regression"),
    (["--task", "stsb", "--head", "classification"], "give --head regression, not --head classification"),
    (["--task", "sst2", "--head", "regression"], "give --head classification, not --head regression"),
    (["--task", "generate", "--head", "classification"], "needs a classification or regression task"),
    (["--task", "sst2", "--head", "pooler"], "unknown --head 'pooler'"),
    (["--task", "sst2", "--head", "classification", "--loss", "lm"], "--loss lm is for the LM head"),
])
def test_a_head_that_does_not_fit_is_one_line_and_exit_2_before_the_model_loads(args, fragment, tmp_path):
    result = run_cli("finetune", *NO_MODEL, *args, "--out", str(tmp_path / "new"))
    one_line_error(result, fragment)
    assert not (tmp_path / "new").exists()


@pytest.mark.parametrize("head, task", [("classification", "sentiment-head"), ("regression", "stsb-regression")])
def test_the_folder_round_trips_into_explain_with_each_head_task(tiny_tokenizer, tmp_path, head, task):
    if head == "classification":
        data, options = toy_file(tmp_path / "toy.jsonl"), {"task": "sentiment", "text_field": "review"}
        text = "the dog was terrific"
    else:
        data, options = toy_pairs(tmp_path / "pairs.jsonl"), {"task": "stsb"}
        text = {"sentence1": "a fox runs", "sentence2": "the dog same"}
    finetune(build_tiny("llama", tiny_tokenizer), tmp_path / "ft", data=str(data), head=head, held_out=20,
             epochs=1, progress=False, **options)
    lm = load_model(str(tmp_path / "ft"), device="cpu")
    explained = llmattr.explain(text, model=lm, method=list(HEAD_METHODS), task=task, progress=False)
    assert [e.method for e in explained] == list(HEAD_METHODS)
    example = get_task(task).example_from_text(text)
    ids = torch.tensor([get_task(task).head_input_ids(lm.tokenizer, example)])
    offsets = lm.tokenizer(get_task(task).user_content(example)[0], return_offsets_mapping=True)["offset_mapping"]
    span = get_task(task).head_span(offsets, example)
    for e in explained:
        assert e.token_ids == ids[0].tolist() and e.task == task and tuple(e.span) == span
        assert len(e.steps[0].raw) == span[1] - span[0] < ids.shape[1]  # the template's words are not attributed
    if head == "classification":  # issue 51 item 4: "Text:" stays out, the text's own tokens are the span
        assert "".join(explained[0].tokens[span[0]: span[1]]).strip() == text
    from llmattr.api import explain_text
    from llmattr.request import Request

    steps = []  # issue 51 item 5: each head explanation advances the progress bar (it stayed at 0%)
    explain_text(lm, text, Request(task, methods=list(HEAD_METHODS)), advance=lambda: steps.append(1))
    assert len(steps) == len(HEAD_METHODS)
    normx = explained[0]
    expected, label, output = classifier_scores(lm.model, ids, method="normxlogit")
    assert normx.steps[0].raw == pytest.approx(expected[span[0]: span[1]].tolist())
    assert normx.steps[0].token == ("score" if head == "regression" else get_task(task).label_words[label])
    rows = llmattr.faithfulness.evaluate(normx, lm, metrics=("comp-suff",))["comp-suff"]
    faithful = head_faithfulness(lm.model, ids, torch.tensor(normx.steps[0].raw), span=span)
    for key in ("comprehensiveness", "sufficiency"):  # a regression head: its outputs per K (Pearson r: the report)
        stored = [r.value for r in rows if r.metric == (f"{key}_output" if head == "regression" else key)]
        assert stored == pytest.approx(getattr(faithful, f"{key}_pred" if head == "regression" else key))
    with pytest.raises(LlmattrError, match="does not explain a sequence head"):
        llmattr.explain(text, model=lm, method="grad-ellm", task=task)
    prompted = get_task(task).extra["lm_alternative"]
    with pytest.raises(LlmattrError, match=f"lacks one .*use the head task, e.g. --task {task}"):
        llmattr.explain(text, model=lm, method="saliency", task=prompted)
    with pytest.raises(LlmattrError, match="needs a sequence-"):
        llmattr.explain(text, model=build_tiny("llama", tiny_tokenizer), method="normxlogit", task=task)


def test_evaluate_and_report_take_a_head_folder_with_comp_suff(tiny_tokenizer, tmp_path):
    """``llmattr evaluate`` on a --head folder: the head's explanation, comp-suff's rows equal to paper 003's
    eqs. 5-8 on the head (tokens deleted), the rows it was trained on left out, and the report's comprehensiveness
    table (Table 1's layout) with every method."""
    data = toy_file(tmp_path / "toy.jsonl")
    head_finetune(build_tiny("llama", tiny_tokenizer), tmp_path / "ft", data, epochs=1)
    lm = load_model(str(tmp_path / "ft"), device="cpu")
    expl = llmattr.explain("the dog was terrific", model=lm, method="normxlogit", task="sentiment-head")
    rows = llmattr.faithfulness.evaluate(expl, lm, metrics=("comp-suff",))["comp-suff"]
    expected = head_faithfulness(lm.model, torch.tensor([expl.token_ids]), expl.score_matrix(raw=True)[0],
                                 span=tuple(expl.span))
    drops = [r.value for r in rows if r.metric == "comprehensiveness"]
    assert drops == pytest.approx(expected.comprehensiveness)
    store = tmp_path / "ev.sqlite"
    result = run_cli("evaluate", "--model", str(tmp_path / "ft"), "--data", str(data), "--task", "sentiment-head",
                     "--text-field", "review", "--methods", ",".join(HEAD_METHODS), "--metrics", "comp-suff",
                     "--n", "6", "--out", str(store))
    assert result.returncode == 0, result.stderr
    assert re.search(r"left out \d+ rows that", result.stderr)  # the training rows (its model card)
    report = run_cli("report", str(store), "--out", str(tmp_path / "report"))
    assert report.returncode == 0, report.stderr
    table = (tmp_path / "report" / "report.md").read_text()
    assert "Comprehensiveness (paper 003 Tables 1 and 4)" in table
    assert all(f"| {method}" in table for method in HEAD_METHODS if method != "random")
    ratio_curves_are_drawn(store, tmp_path / "report", table)


def ratio_curves_are_drawn(store, folder, report_md):
    """Paper 003 Figs. 2-3 in the report of a head model: one PNG per dataset, a panel per criterion (Comp CD, Suff
    CD, Comp Acc, Suff Acc), each method's line at K = 10..90% equal to the mean over examples of its stored rows,
    and each method's colour in the PNG's pixels."""
    import sqlite3

    import numpy as np
    from PIL import Image

    from llmattr.api import catalog
    from llmattr.faithfulness.ranks import K_GRID
    from llmattr.plotting import method_colors
    from llmattr.report import figures
    from llmattr.store import Results

    png = folder / "fig2_comp_suff_toy.png"  # the --data file's dataset
    assert f"![{png.stem}]({png.name})" in report_md
    expected = defaultdict(list)  # (metric, method) -> the mean over examples at each K, from the store itself
    with sqlite3.connect(store) as con:
        for metric, method, x, value in con.execute(
                "SELECT metric, method, x, AVG(value) FROM results WHERE metric IN ('comprehensiveness', "
                "'sufficiency', 'comprehensiveness_acc', 'sufficiency_acc') GROUP BY metric, method, x ORDER BY x"):
            expected[metric, method].append((x, value))
    drawn = []
    cat = catalog()
    results = Results([store], cat.method_defaults, cat.datasets)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(figures, "_save", lambda fig, path: drawn.append(fig) or path)
        written = figures.all_figures(results, results.models()[0], folder / "again", cat, resamples=50)
    names = [f.path.name for f in written]
    assert png.name in names
    axes = [ax for ax in drawn[names.index(png.name)].axes if ax.get_visible()]
    assert [ax.get_ylabel() for ax in axes] == ["Comp CD", "Suff CD", "Comp Acc", "Suff Acc"]
    colors = method_colors(HEAD_METHODS)
    for ax, metric in zip(axes, ("comprehensiveness", "sufficiency", "comprehensiveness_acc", "sufficiency_acc"),
                          strict=True):
        assert sorted(line.get_label() for line in ax.lines) == sorted(HEAD_METHODS)
        for line in ax.lines:
            x, y = line.get_data()
            assert list(x) == pytest.approx(K_GRID)
            assert [v for _, v in expected[metric, line.get_label()]] == pytest.approx(list(y), abs=1e-12)
            assert line.get_color() == colors[line.get_label()]
    pixels = np.asarray(Image.open(png).convert("RGB")).reshape(-1, 3)
    for method, color in colors.items():
        rgb = np.array([int(color[i: i + 2], 16) for i in (1, 3, 5)])
        assert (np.abs(pixels.astype(int) - rgb).max(1) <= 2).sum() > 50, method  # its line in its colour
