"""``llmattr finetune`` on tiny models: the loss falls and a separable toy task is learnt, the held-out split never
meets the training rows, an interrupted run resumes to the same weights, the folder loads with ``--model DIR``, and
bad input is one line and exit 2 before training."""

from __future__ import annotations

import json
import random
from dataclasses import asdict, replace

import pytest
import torch
import transformers
from safetensors.torch import load_file

from conftest import build_tiny
from llmattr import finetuning
from llmattr.errors import LlmattrError
from llmattr.evaluation.accuracy import label_accuracy
from llmattr.finetuning import (
    Collator,
    FinetuneConfig,
    cap,
    check_out,
    finetune,
    label_loss,
    label_sequence,
    lm_sequence,
    permuted,
    split,
)
from llmattr.models.card import CARD_NAME, card_facts, content_hash, read_card
from llmattr.models.loading import load_model
from llmattr.prompting import build_prompt
from llmattr.tasks import get_task
from llmattr.tasks.files import read_file_examples
from test_cli_checks import NO_MODEL, one_line_error, run_cli

FILLER = "the quick brown fox jumps over the lazy dog".split()


def toy_file(path, n=60, seed=0, duplicate=False):
    """A separable sentiment file: the label is decided by one word ('terrific' or 'dull') among filler words."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        label = "positive" if i % 2 else "negative"
        words = rng.sample(FILLER, 4)
        words.insert(rng.randrange(5), "terrific" if label == "positive" else "dull")
        rows.append({"review": " ".join(words), "label": label})
    if duplicate:  # the same text twice under two ids: it must not sit on both sides of the split
        rows += [dict(row) for row in rows[:10]]
    path.write_text("\n".join(json.dumps(row) for row in rows))
    return path


def toy_finetune(lm, out, data, **options):
    settings = {"task": "sentiment", "data": str(data), "text_field": "review", "held_out": 20,
                "learning_rate": 3e-3, "batch_size": 8, "epochs": 2, "progress": False, **options}
    return finetune(lm, out, **settings)


def test_loss_falls_and_the_toy_task_is_learnt_and_the_folder_loads(tiny_tokenizer, tmp_path):
    data = toy_file(tmp_path / "toy.jsonl")
    task, examples = read_file_examples("sentiment", data, "review")
    train, held = split(task, examples, 20, 0)
    base = label_accuracy(build_tiny("llama", tiny_tokenizer), task, held)
    card = toy_finetune(build_tiny("llama", tiny_tokenizer), tmp_path / "ft", data, epochs=10)
    losses = [loss for _, loss in card["loss_curve"]]
    assert losses[-1] < 0.5 * losses[0]
    assert card["held_out"]["accuracy"] >= 0.9 and card["held_out"]["n"] == 20
    assert base["accuracy"] < 0.8  # the random model had not learnt it: the fine-tune did
    assert card["held_out"]["low"] <= card["held_out"]["accuracy"] <= card["held_out"]["high"]
    assert card["status"] == "done" and card["seed"] == 0 and card["n_train"] == len(train)
    assert not (tmp_path / "ft" / "checkpoints").exists()
    readme = (tmp_path / "ft" / "README.md").read_text()
    assert f"held-out accuracy | {card['held_out']['accuracy']:.3f}" in readme and "tiny-llama" in readme
    loaded = load_model(str(tmp_path / "ft"), device="cpu")  # what --model DIR does everywhere
    assert label_accuracy(loaded, task, held)["accuracy"] == card["held_out"]["accuracy"]


def test_the_held_out_split_never_meets_the_training_rows(tiny_tokenizer, tmp_path):
    data = toy_file(tmp_path / "toy.jsonl", duplicate=True)
    task, examples = read_file_examples("sentiment", data, "review")
    train, held = split(task, examples, 20, 0)
    assert {ex["id"] for ex in train}.isdisjoint(ex["id"] for ex in held)
    held_texts = {task.user_content(ex)[0] for ex in held}
    assert all(task.user_content(ex)[0] not in held_texts for ex in train)
    assert len(train) + len(held) < len(examples)  # the duplicates of held-out rows left training
    assert [ex["label"] for ex in held].count("Positive") == 10  # balanced per class
    card = toy_finetune(build_tiny("llama", tiny_tokenizer), tmp_path / "ft", data, epochs=1)
    assert card["train_ids"] == [ex["id"] for ex in train] and card["held_out_ids"] == [ex["id"] for ex in held]
    assert set(card["train_hashes"]) == {content_hash(task.user_content(ex)[0]) for ex in train}


class Interrupt(transformers.TrainerCallback):
    """Stops training like Ctrl-C right after the checkpoint of step ``at`` is written."""

    def __init__(self, at: int):
        self.at = at

    def on_save(self, args, state, control, **kwargs):
        if state.global_step == self.at:
            raise KeyboardInterrupt


def straight_and_resumed(run, tiny_tokenizer, tmp_path, data) -> tuple[dict, dict]:
    """``run`` straight into ``straight/`` and, interrupted after step 4's checkpoint, resumed into ``resumed/``;
    asserts the two write the same weights bit for bit and returns the resumed run's card and the weights."""
    options = {"epochs": 2, "save_steps": 2}
    run(build_tiny("llama", tiny_tokenizer), tmp_path / "straight", data, **options)
    with pytest.raises(KeyboardInterrupt):
        run(build_tiny("llama", tiny_tokenizer), tmp_path / "resumed", data, callbacks=(Interrupt(4),), **options)
    card = json.loads((tmp_path / "resumed" / CARD_NAME).read_text())
    assert card["status"] == "training" and (tmp_path / "resumed" / "checkpoints" / "checkpoint-4").is_dir()
    resumed = run(build_tiny("llama", tiny_tokenizer), tmp_path / "resumed", data, **options)
    straight, again = (load_file(tmp_path / name / "model.safetensors") for name in ("straight", "resumed"))
    assert straight.keys() == again.keys()
    for name, weight in straight.items():
        torch.testing.assert_close(again[name], weight, rtol=0, atol=0, msg=name)
    return resumed, straight


def test_an_interrupted_run_resumes_to_the_same_weights(tiny_tokenizer, tmp_path):
    resumed, straight = straight_and_resumed(toy_finetune, tiny_tokenizer, tmp_path, toy_file(tmp_path / "toy.jsonl"))
    assert resumed["loss_curve"][0][0] == 1 and resumed["loss_curve"][-1][0] == 10  # one history, steps 1..10
    trained = build_tiny("llama", tiny_tokenizer).model.state_dict()
    assert any(not torch.equal(trained[name].cpu(), weight) for name, weight in straight.items() if name in trained)


def test_a_rerun_with_other_settings_or_on_a_finished_folder_is_refused(tiny_tokenizer, tmp_path):
    data = toy_file(tmp_path / "toy.jsonl")
    with pytest.raises(KeyboardInterrupt):
        toy_finetune(build_tiny("llama", tiny_tokenizer), tmp_path / "ft", data, epochs=1, save_steps=2,
                     callbacks=(Interrupt(2),))
    with pytest.raises(LlmattrError, match="other settings .*epochs: 1 -> 2"):
        toy_finetune(build_tiny("llama", tiny_tokenizer), tmp_path / "ft", data, epochs=2, save_steps=2)
    toy_finetune(build_tiny("llama", tiny_tokenizer), tmp_path / "ft", data, epochs=1, save_steps=2)
    with pytest.raises(LlmattrError, match="holds a finished finetune"):
        toy_finetune(build_tiny("llama", tiny_tokenizer), tmp_path / "ft", data, epochs=1, save_steps=2)


def test_the_label_sequence_is_the_task_prompt_and_its_label_token(tiny_tokenizer):
    task = get_task("sst2")
    example = {"id": "a", "text": "A terrific film.", "label": "Negative"}
    ids = task.label_ids(tiny_tokenizer)
    seq = label_sequence(tiny_tokenizer, task, example, ids)
    prompt = build_prompt(tiny_tokenizer, task, example).input_ids[0].tolist()  # what explain/evaluate build
    assert seq["input_ids"] == prompt and seq["labels"] == [-100, int(ids[1])]
    short = label_sequence(tiny_tokenizer, task, {"id": "b", "text": "Dull.", "label": "Positive"}, ids)
    batch = Collator(pad_id=2, left=True)([seq, short])
    pad = len(prompt) - len(short["input_ids"])
    assert batch["input_ids"][1, pad:].tolist() == short["input_ids"] and (batch["input_ids"][1, :pad] == 2).all()
    assert batch["position_ids"][1, pad:].tolist() == list(range(len(short["input_ids"])))
    assert batch["logits_to_keep"] == 1 and batch["labels"][:, -1].tolist() == [int(ids[1]), int(ids[0])]
    lm = lm_sequence(tiny_tokenizer, task, example)
    assert lm["labels"][1:] == lm["input_ids"][1:] and lm["labels"][0] == -100  # every text token but BOS
    other = lm_sequence(tiny_tokenizer, task, {"id": "c", "text": "Dull."})
    right = Collator(pad_id=2)([lm, other])
    assert right["attention_mask"].sum(1).tolist() == [len(lm["input_ids"]), len(other["input_ids"])]
    assert (right["labels"][right["attention_mask"] == 0] == -100).all() and "position_ids" not in right


def test_the_label_loss_is_the_label_words_cross_entropy_at_the_answer_position(tiny_tokenizer):
    """On a left-padded batch, label_loss = mean_b -log softmax(logits of the unpadded prompt b at its last
    position)[y_b]: the padding, the position ids and logits_to_keep change nothing."""
    lm = build_tiny("llama", tiny_tokenizer)
    task = get_task("sst2")
    ids = task.label_ids(tiny_tokenizer)
    seqs = [label_sequence(tiny_tokenizer, task, {"id": str(i), "text": text, "label": label}, ids)
            for i, (text, label) in enumerate([("A dull film that made no sense.", "Positive"), ("Fine.", "Negative")])]
    batch = {k: v.to(lm.device) if torch.is_tensor(v) else v for k, v in Collator(pad_id=2, left=True)(seqs).items()}
    labels = batch.pop("labels")
    with torch.no_grad():
        loss = label_loss(lm.model(**batch), labels)
        expected = []
        for seq in seqs:
            logits = lm.model(input_ids=torch.tensor([seq["input_ids"]], device=lm.device)).logits[0, -1].double()
            expected.append(-torch.log_softmax(logits, -1)[seq["labels"][-1]])
    expected = torch.stack(expected).mean()
    torch.testing.assert_close(loss.double(), expected, rtol=1e-5, atol=0)


def test_lora_and_the_lm_loss_write_a_plain_folder(tiny_tokenizer, tmp_path, recwarn):
    data = toy_file(tmp_path / "toy.jsonl")
    card = toy_finetune(build_tiny("llama", tiny_tokenizer), tmp_path / "lora", data, lora_r=4, epochs=1)
    assert card["hyperparameters"]["lora_r"] == 4
    assert not [w for w in recwarn if "is_gradient_checkpointing" in str(w.message)]  # peft's call, not shown
    names = {p.name for p in (tmp_path / "lora").iterdir()}
    assert "model.safetensors" in names and "adapter_config.json" not in names  # merged: loads without peft
    weights = load_file(tmp_path / "lora" / "model.safetensors")
    assert not any("lora" in name for name in weights)
    base = build_tiny("llama", tiny_tokenizer).model.state_dict()
    assert any(not torch.equal(base[n].cpu(), w) for n, w in weights.items() if n in base and w.dim() == 2)
    lm_card = toy_finetune(build_tiny("llama", tiny_tokenizer), tmp_path / "lm", data, loss="lm", epochs=2)
    assert lm_card["loss"] == "lm" and lm_card["loss_curve"][-1][1] < lm_card["loss_curve"][0][1]
    assert "objective" not in lm_card and "objective" not in lm_card["settings"]


def test_a_task_without_classes_trains_on_every_row_with_the_lm_loss(tiny_tokenizer, tmp_path):
    """STS-B's prompted scores with ``--loss lm``: every row trains, none is held out (a float score is no class to
    balance over nor a label word to score); before, the split balanced them over "0"-"5" and always refused."""
    data = tmp_path / "stsb.jsonl"
    data.write_text("".join(json.dumps({"sentence1": f"A cat sat {i}.", "sentence2": f"A dog ran {i}.",
                                        "score": i % 6 + 0.4}) + "\n" for i in range(12)), encoding="utf-8")
    card = finetune(build_tiny("llama", tiny_tokenizer), tmp_path / "ft", task="stsb", data=str(data), loss="lm",
                    epochs=1, batch_size=4, progress=False)
    assert card["n_train"] == 12 and card["n_held_out"] == 0 and "held_out" not in card


@pytest.mark.parametrize("args, fragment", [
    (["--task", "nosuchtask"], "unknown task 'nosuchtask'"),
    (["--task", "stsb"], "--task stsb-regression --head regression"),
    (["--task", "sentiment", "--data", "{tmp}/toy.jsonl", "--text-field", "review", "--label-field", "stars"],
     "no column 'stars' for the label"),
    (["--task", "sentiment", "--data", "{tmp}/toy.jsonl"], "no column 'text' for field 'text'"),
    (["--task", "sst2", "--out", "{tmp}/busy"], "exists and is not a llmattr finetune's folder"),
    (["--task", "sst2", "--out", "{tmp}/toy.jsonl"], "is a file"),
    (["--task", "sst2", "--loss", "mlm"], "unknown --loss 'mlm'"),
    (["--task", "sst2", "--objective", "mlm"], "unknown --loss 'mlm'"),  # --loss's old name reaches the config
    (["--task", "sst2", "--loss", "lm", "--objective", "label"], "--loss (or its old name --objective), not both"),
    (["--task", "stsb", "--objective", "label"], "use --loss lm to fine-tune on its text"),
    (["--task", "sst2", "--load-in-4bit", "--lora-r", "8"], "needs bitsandbytes"),
    (["--task", "sst2", "--held-out", "0"], "--held-out must be at least 1"),
])
def test_bad_input_is_one_line_and_exit_2_before_training(args, fragment, tmp_path):
    toy_file(tmp_path / "toy.jsonl")
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "notes.txt").write_text("someone's work")
    argv = [a.format(tmp=tmp_path) for a in args]
    if "--out" not in argv:
        argv += ["--out", str(tmp_path / "new")]
    result = run_cli("finetune", *NO_MODEL, *argv)
    one_line_error(result, fragment)
    assert not (tmp_path / "new").exists() and (tmp_path / "busy" / "notes.txt").read_text() == "someone's work"


def test_long_texts_are_cut_to_max_tokens(tiny_tokenizer):
    task = get_task("imdb")
    text = " ".join(["the quick brown fox jumps"] * 40)
    capped = cap(task, {"id": "a", "text": text, "label": "Positive"}, tiny_tokenizer, 8)
    ids = tiny_tokenizer(text, add_special_tokens=False)["input_ids"]
    assert len(ids) > 8 and capped["text"] == tiny_tokenizer.decode(ids[:8]) and text.startswith(capped["text"])
    assert cap(task, {"id": "b", "text": "Fine.", "label": "Positive"}, tiny_tokenizer, 8)["text"] == "Fine."


def test_the_config_defaults_are_the_issues_recipe():
    cfg = FinetuneConfig()
    assert (cfg.epochs, cfg.learning_rate, cfg.batch_size, cfg.held_out) == (3, 1e-5, 8, 80)


def test_the_loss_under_its_old_name_objective_keeps_working():
    """``finetune --loss`` (the training loss) was ``--objective`` before issue 39: that spelling still gives the
    loss in the config, the CLI (hidden from its help) and ``finetune(..., objective=...)``; the new name is what
    is recorded."""
    assert FinetuneConfig(objective="lm").loss == "lm" == replace(FinetuneConfig(), objective="lm").loss
    assert FinetuneConfig(loss="lm", objective="lm").loss == "lm"
    assert "loss" in asdict(FinetuneConfig()) and "objective" not in asdict(FinetuneConfig(objective="lm"))
    with pytest.raises(LlmattrError, match="not both"):
        FinetuneConfig(loss="lm", objective="label")
    shown = run_cli("finetune", "--help").stdout
    assert "--loss" in shown and "--objective" not in shown


def test_a_card_written_before_the_loss_was_named_loss_reads_and_its_run_resumes(tmp_path):
    """An old card names the loss ``objective`` (also in its recorded settings): it reads as ``loss``, the report's
    facts are those of a new card, and an unfinished run of then is resumed rather than refused."""
    settings = {"base_model": "tiny", **asdict(FinetuneConfig()), "data_sha256": "abc"}
    old_settings = {("objective" if k == "loss" else k): v for k, v in settings.items()}
    card = {"status": "training", "settings": old_settings, "task": "sst2", "objective": "lm", "seed": 0}
    (tmp_path / "ft").mkdir()
    (tmp_path / "ft" / CARD_NAME).write_text(json.dumps(card))
    read = read_card(tmp_path / "ft")
    assert read["loss"] == "lm" and "objective" not in read and read["settings"] == settings
    assert card_facts(read) == {"task": "sst2", "loss": "lm", "seed": 0}
    assert check_out(tmp_path / "ft", settings) == read


def test_permute_labels_trains_on_the_training_labels_permuted(tiny_tokenizer, tmp_path, monkeypatch):
    """``--permute-labels`` (the data randomisation sanity check's model): the training rows keep their texts and ids,
    their labels are a seeded permutation of theirs; the card records it; without it the labels are the gold ones."""
    data = toy_file(tmp_path / "toy.jsonl")
    task, examples = read_file_examples("sentiment", data, "review")
    train, _ = split(task, examples, 20, 0)
    shuffled = permuted(train, 0)
    assert [ex["id"] for ex in shuffled] == [ex["id"] for ex in train] and shuffled == permuted(train, 0)
    assert sorted(ex["label"] for ex in shuffled) == sorted(ex["label"] for ex in train)
    assert [ex["label"] for ex in shuffled] != [ex["label"] for ex in train]
    seen = []

    def stop(lm, rows, *args):
        seen.append(rows)
        raise KeyboardInterrupt
    monkeypatch.setattr(finetuning, "build_trainer", stop)
    for permute in (False, True):
        with pytest.raises(KeyboardInterrupt):
            toy_finetune(build_tiny("llama", tiny_tokenizer), tmp_path / f"ft{permute}", data, permute_labels=permute)
    label_ids = task.label_ids(tiny_tokenizer)
    gold = [[int(label_ids[task.label_words.index(ex["label"])]) for ex in rows] for rows in (train, shuffled)]
    assert [[row["labels"][-1] for row in rows] for rows in seen] == gold
    assert read_card(tmp_path / "ftTrue")["settings"]["permute_labels"] is True
    assert "permute_labels" not in read_card(tmp_path / "ftFalse")["settings"]  # older cards resume unchanged
    with pytest.raises(LlmattrError, match="--permute-labels"):
        toy_finetune(build_tiny("llama", tiny_tokenizer), tmp_path / "lm", data, permute_labels=True, loss="lm")
