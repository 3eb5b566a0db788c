"""Issue 35 item 7, finetune's and the file labels' refusals before torch: a label value of a user's file that the
task cannot read, a finetune task without sample data, ``--held-out`` against the rows, ``--out`` holding another
run. The CLI calls the library's own checks (:func:`llmattr.finetuning.plan`, :func:`llmattr.evaluation.plan`: one
path, issue 49); these tests hold them to the answer of the code that would fail later (the lines themselves are in
``tests/test_cli_fast.py``'s REFUSALS, compared with the lines printed before the checks moved), and check what
changed in the library: a regression label that is not a number is one line, not a traceback."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from llmattr.errors import LlmattrError
from llmattr.finetuning import (
    FinetuneConfig,
    check_out,
    head_name,
    head_task,
    held_out_split,
    plan,
    resumable_card,
    split,
)
from llmattr.tasks import TASKS, get_task, load_examples
from llmattr.tasks.base import gold_label, task_facts
from llmattr.tasks.files import read_file_examples
from test_cli_fast import FILES, HEAVY, ROOT, run_cli

NOT_A_NUMBER = ("{path}: line 3: task {task}: label 'high' of row scores-1 is not a number; fix the file or map the "
                "label column")


@pytest.mark.parametrize("args, task", [
    (["evaluate", "--data", f"{FILES}/scores.csv", "--task", "stsb"], "stsb"),
    (["finetune", "--out", "/nonexistent/ft", "--task", "stsb", "--loss", "lm", "--data", f"{FILES}/scores.csv"],
     "stsb"),
    (["finetune", "--out", "/nonexistent/ft", "--task", "stsb", "--head", "regression", "--data",
      f"{FILES}/scores.csv"], "stsb-regression"),
])
def test_a_regression_label_that_is_not_a_number_is_one_line_exit_2_before_torch(args, task):
    """Before: ``float('high')``'s traceback, after torch had loaded; now the line of every other label refusal."""
    _, code, heavy, err = run_cli(args)
    assert (code, heavy) == (2, [])
    assert " ".join(err.split()) == "error: " + NOT_A_NUMBER.format(path=f"{FILES}/scores.csv", task=task)


def test_the_library_refuses_it_in_the_same_line():
    path = ROOT / FILES / "scores.csv"
    with pytest.raises(LlmattrError) as refused:
        read_file_examples("stsb", path)
    assert str(refused.value) == NOT_A_NUMBER.format(path=path, task="stsb")
    with pytest.raises(LlmattrError, match="^task stsb: label 'high' is not a number"):
        get_task("stsb").gold_label("high")  # the API's spelling, one line too
    assert get_task("stsb").gold_label("3.4") == 3.4 and get_task("sst2").gold_label("positive") == "Positive"


LABELS = [None, "positive", "negative", "Positive", "maybe", "", "1", 1, 0, 2, 2.5, True, "3.5", "nan", "high"]


def random_file(path, rng):
    """A small file of random label values, as JSONL (numbers stay numbers) or CSV (text), some rows with ids; its
    columns fit a one-field task (``review``) and STS-B (``sentence1``, ``sentence2``)."""
    pool = rng.choice([["positive", "negative"], [0, 1, "1", 2.5], LABELS[1:]])  # often every label readable
    rows = [{"review": f"text {i}", "sentence1": "a", "sentence2": "b", "label": rng.choice(pool),
             **({"id": f"r{i}"} if rng.random() < .3 else {})} for i in range(rng.randint(1, 5))]
    if path.suffix == ".jsonl":
        path.write_text("\n".join(json.dumps(row) for row in rows) + "\n", encoding="utf-8")
    else:
        columns = list(dict.fromkeys(key for row in rows for key in row))
        path.write_text(",".join(columns) + "\n" + "".join(",".join(str(row.get(key, "")) for key in columns) + "\n"
                                                          for row in rows), encoding="utf-8")


def finetune_checks(task, loss, objective, settings, data, text_field, label_field, labels, out):
    """What ``llmattr finetune`` refuses before the model loads: the library's :func:`llmattr.finetuning.plan`."""
    plan("default", out, FinetuneConfig(task=task, loss=loss, objective=objective, data=None if data is None
                                        else str(data), text_field=text_field, label_field=label_field,
                                        labels=labels, **settings))


def test_gold_label_reads_a_label_as_the_task_does():
    sentiment, stsb, generate = (task_facts(get_task(name)) for name in ("sentiment", "stsb", "generate"))
    assert gold_label(sentiment, "positive", "r1") == "Positive" and gold_label(sentiment, "Negative") == "Negative"
    with pytest.raises(LlmattrError, match=r"^task sentiment: label None of row r1 is not one of \['positive'"):
        gold_label(sentiment, None, "r1")
    assert gold_label(stsb, "4") == 4.0 and gold_label(stsb, None) is None
    assert gold_label(generate, "anything") == "anything" and gold_label(generate, None) is None


def test_a_finetune_holds_rows_out_only_where_it_measures_them():
    """Held-out rows for a head or a classification task's label words; STS-B's prompted scores trained with
    ``--loss lm`` (numbers, not classes: no accuracy to measure) train on every row. Before, the split balanced
    them over the label words "0"-"5", which no float label equals: "only 0 examples of class '0'" always."""
    stsb, sst2, wikibio = (task_facts(get_task(name)) for name in ("stsb", "sst2", "wikibio"))
    assert not held_out_split(stsb, None) and not held_out_split(wikibio, None)
    assert held_out_split(sst2, None) and held_out_split(stsb, "regression")
    examples = load_examples("stsb")
    train, held = split(get_task("stsb-regression"), examples, 5, 0)  # a plain seeded draw: no classes
    assert len(held) == 5 and len(train) + len(held) <= len(examples)


def test_held_out_beyond_the_balance_of_a_file_is_refused_as_split_refuses_it(tmp_path):
    """``--held-out`` rows balanced over the classes: 4 positive + 1 negative rows hold out at most 3 (2 + 1); the
    CLI (from the file, without torch) and :func:`split` (on the examples) refuse 4 in the same line."""
    path = ROOT / FILES / "unbalanced.csv"
    task, examples = read_file_examples("sentiment", path, "review", "sentiment")
    with pytest.raises(LlmattrError) as refused:
        split(task, examples, 4, 0)
    assert str(refused.value).startswith("only 1 examples of class 'Negative' for a balanced sample of 4; ask for "
                                         "n <= 3")
    settings = {"held_out": 4, "epochs": 1, "learning_rate": 1e-5, "batch_size": 8, "max_tokens": 8, "lora_r": 0,
                "save_steps": 5, "load_in_4bit": False, "head": None, "permute_labels": False, "mask_augment": 0.0}
    with pytest.raises(LlmattrError) as cli:
        finetune_checks("sentiment", "label", None, settings, path, "review", "sentiment", None, tmp_path / "new")
    assert str(cli.value) == str(refused.value)
    assert len(split(task, examples, 3, 0)[1]) == 3
    finetune_checks("sentiment", "label", None, {**settings, "held_out": 3}, path, "review", "sentiment", None,
                    tmp_path / "new")


@pytest.mark.parametrize("task, head, held_out, refused", [
    ("sst2", None, 655, False), ("sst2", None, 656, True), ("sst2", "classification", 656, True),
    ("stsb", "regression", 999, False), ("stsb", "regression", 1000, True),
    ("wikibio", None, 5000, False),  # --loss lm on a task without label words: no split, so no held-out rows
])
def test_held_out_is_refused_where_the_library_splits(task, head, held_out, refused, tmp_path):
    """The CLI refuses ``--held-out`` exactly where :func:`llmattr.finetuning.split` would, on the rows
    :func:`llmattr.finetuning.read_examples` reads."""
    settings = {"held_out": held_out, "epochs": 1, "learning_rate": 1e-5, "batch_size": 8, "max_tokens": 8,
                "lora_r": 0, "save_steps": 5, "load_in_4bit": False, "head": head, "permute_labels": False,
                "mask_augment": 0.0}
    loss = "lm" if task == "wikibio" else "label"
    cfg = FinetuneConfig(task=task, loss=loss, **settings)
    trained = cfg.validate()
    examples = load_examples(trained)
    try:
        if held_out_split(task_facts(trained), head):  # finetune splits only then
            split(trained, examples, held_out, 0)
        library = False
    except LlmattrError as err:  # or a balanced draw that cannot be made (not this check)
        library = "leaves no training rows" in str(err)
    assert library == refused
    if refused:
        with pytest.raises(LlmattrError, match=f"^--held-out {held_out} leaves no training rows of {len(examples)}$"):
            finetune_checks(task, loss, None, settings, None, None, None, None, tmp_path / "new")
    else:
        finetune_checks(task, loss, None, settings, None, None, None, None, tmp_path / "new")


def test_head_name_is_the_task_head_task_trains():
    for name, task in sorted(TASKS.items()):
        if task.head == "lm" and (task.classifies or task.numeric):
            assert head_task(task).name == head_name(task_facts(task)), name
        elif task.head != "lm":
            assert head_task(task) is task and head_name(task_facts(task)) == name


def test_out_holding_another_run_is_refused_by_the_library_as_by_the_cli(tmp_path):
    """The card's two refusals (not a finetune's folder; a finished one) come from :func:`resumable_card`, which
    ``check_out`` calls; an unfinished run with other settings still needs the examples (``check_out``)."""
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "notes.txt").write_text("someone's work")
    (tmp_path / "empty").mkdir()
    for folder, status in (("done", "done"), ("running", "training")):
        (tmp_path / folder).mkdir()
        card = {"llmattr_finetune": 1, "status": status, "task": "sst2", "settings": {"epochs": 1}}
        (tmp_path / folder / "llmattr_finetune.json").write_text(json.dumps(card))
    with pytest.raises(LlmattrError) as cli:
        resumable_card(tmp_path / "done")
    with pytest.raises(LlmattrError) as library:
        check_out(tmp_path / "done", {"epochs": 1})
    assert str(cli.value) == str(library.value) and "holds a finished finetune (sst2" in str(cli.value)
    with pytest.raises(LlmattrError, match="is not a llmattr finetune's folder"):
        check_out(tmp_path / "busy", {})
    assert resumable_card(tmp_path / "empty") is None and resumable_card(tmp_path / "new") is None
    assert resumable_card(tmp_path / "running")["settings"] == {"epochs": 1}
    assert check_out(tmp_path / "running", {"epochs": 1})["status"] == "training"
    with pytest.raises(LlmattrError, match=r"other settings \(epochs: 1 -> 2\)"):
        check_out(tmp_path / "running", {"epochs": 2})


def test_the_card_and_the_checks_import_no_torch_and_old_paths_read():
    code = ("import json, sys, llmattr.model_card, llmattr.finetuning, llmattr.readers; "
            f"print(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(done.stdout) == []
    from llmattr import model_card, readers
    from llmattr.models import card
    from llmattr.tasks import datasets, files

    assert card.read_card is model_card.read_card and card.CARD_NAME == model_card.CARD_NAME
    assert datasets.data_dir is readers.data_dir and files.label_text("x") == "x"
    assert (readers.data_dir() / "sst2.jsonl").is_file()
