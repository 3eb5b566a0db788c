"""A user's own JSONL/CSV file (``--data --text-field --label-field --labels``) for finetune and evaluate:
one reader (llmattr.tasks.files), one-line errors before the model loads, and an evaluation of a fine-tuned model
that leaves out every row its model card says it was trained on."""

from __future__ import annotations

import csv
import json
import sqlite3

import pytest

from conftest import build_tiny
from llmattr.errors import LlmattrError
from llmattr.models.card import CARD_NAME
from llmattr.report.layouts import accuracy_table
from llmattr.report.writers import to_markdown
from llmattr.store import Results
from llmattr.tasks.files import parse_labels, read_file_examples
from test_cli_checks import NO_MODEL, one_line_error, run_cli
from test_finetune import toy_file


def write_csv(path, rows):
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return path


def test_a_csv_with_its_own_columns_and_label_values(tmp_path):
    path = write_csv(tmp_path / "reviews.csv", [{"review": "Great fun.", "stars": "1"},
                                               {"review": "A bore.", "stars": "0"}])
    task, examples = read_file_examples("sentiment", path, "review", "stars", "0=Negative,1=Positive")
    assert task.label_words == ("Negative", "Positive")
    assert [(ex["id"], ex["text"], ex["label"]) for ex in examples] == [
        ("reviews-0", "Great fun.", "Positive"), ("reviews-1", "A bore.", "Negative")]


def test_a_jsonl_with_numeric_labels_and_the_tasks_own_label_map(tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_text('{"id": 7, "body": "Fine.", "y": 1}\n{"id": 8, "body": "Dull.", "y": 0}\n')
    _, examples = read_file_examples("sst2", path, "body", "y", "1=Positive,0=Negative")
    assert [(ex["id"], ex["label"]) for ex in examples] == [("7", "Positive"), ("8", "Negative")]
    path.write_text('{"text": "Fine.", "label": "positive"}\n')  # sst2's own map: positive -> Positive
    assert read_file_examples("sst2", path)[1][0]["label"] == "Positive"
    path.write_text('{"passage": "Water is wet.", "question": "is water wet", "label": true}\n')  # JSON boolean
    task, examples = read_file_examples("boolq", path, labels="true,false")
    assert examples[0]["label"] == "true" and examples[0]["question"] == "is water wet"
    path.write_text('{"passage": "Water is wet.", "q": "is water wet", "label": true}\n')
    with pytest.raises(LlmattrError, match="no column 'question' for field 'question' .task boolq reads it by "):
        read_file_examples("boolq", path)


@pytest.mark.parametrize("labels", ["Positive", "A,,", "1=Positive"])
def test_fewer_than_two_label_words_are_refused(labels):
    with pytest.raises(LlmattrError, match="at least two label words"):
        parse_labels(labels)


def test_a_missing_column_names_the_columns_the_file_has(tmp_path):
    path = write_csv(tmp_path / "r.csv", [{"review": "Fine.", "stars": "1"}])
    with pytest.raises(LlmattrError, match=r"line 2 has no column 'label' for the label \(set --label-field\); "
                                            r"its columns: review, stars"):
        read_file_examples("sentiment", path, "review")
    with pytest.raises(LlmattrError, match="no column 'text' for field 'text' .*--text-field"):
        read_file_examples("sentiment", path, label_field="stars")
    with pytest.raises(LlmattrError, match="label '1' of row r-0 is not one of"):
        read_file_examples("sentiment", path, "review", "stars")  # 1 is no label word: say so, name the row


@pytest.mark.parametrize("args, fragment", [
    (["--data", "{tmp}/r.csv", "--text-field", "review"], "no column 'label' for the label"),
    (["--data", "{tmp}/r.csv", "--text-field", "body", "--label-field", "stars"], "no column 'body'"),
    (["--data", "{tmp}/missing.csv"], "data file not found"),
    (["--data", "{tmp}/r.csv", "--text-field", "review", "--label-field", "stars", "--labels", "Yes"],
     "at least two label words"),
])
def test_evaluate_refuses_a_bad_file_before_the_model_loads(args, fragment, tmp_path):
    write_csv(tmp_path / "r.csv", [{"review": "Fine.", "stars": "1"}])
    result = run_cli("evaluate", *NO_MODEL, "--out", str(tmp_path / "out.sqlite"),
                     *(a.format(tmp=tmp_path) for a in args))
    one_line_error(result, fragment)
    assert not (tmp_path / "out.sqlite").exists()


def test_evaluate_on_a_finetune_leaves_out_its_training_rows(tiny_tokenizer, tmp_path):
    """The fine-tuned folder's card lists its training rows; evaluate --data on the same file draws only from the
    rest (the held-out rows), says how many it left out, and the report shows the card under the accuracy."""
    data = toy_file(tmp_path / "toy.jsonl")
    base = build_tiny("llama", tiny_tokenizer)
    base.model.save_pretrained(tmp_path / "tiny-base")
    tiny_tokenizer.save_pretrained(tmp_path / "tiny-base")
    result = run_cli("finetune", "--model", str(tmp_path / "tiny-base"), "--task", "sentiment", "--data", str(data),
                     "--text-field", "review", "--held-out", "20", "--epochs", "1", "--learning-rate", "3e-3",
                     "--out", str(tmp_path / "ft"), "--quiet")
    assert result.returncode == 0, result.stderr
    card = json.loads((tmp_path / "ft" / CARD_NAME).read_text())
    assert f"sentiment: {card['n_train']} training rows, held-out accuracy " in result.stderr
    out = tmp_path / "r.sqlite"
    result = run_cli("evaluate", "--model", str(tmp_path / "ft"), "--data", str(data), "--text-field", "review",
                     "--methods", "random", "--metrics", "comp-suff", "--n", "6", "--out", str(out), "--quiet")
    assert result.returncode == 0, result.stderr
    assert f"toy: left out {card['n_train']} rows that {tmp_path / 'ft'} was trained on" in result.stderr
    with sqlite3.connect(out) as conn:
        evaluated = {row[0] for row in conn.execute("SELECT DISTINCT example FROM explanations")}
    assert len(evaluated) == 6 and evaluated.isdisjoint(card["train_ids"])  # held-out rows (and unused duplicates)
    markdown = to_markdown(accuracy_table(Results([out]), "ft"))  # the store names a folder model by its name
    assert "Model card: sentiment fine-tune of tiny-base" in markdown and f"on {card['n_train']} training rows" \
        in markdown


@pytest.mark.parametrize("args, fragment", [
    (["--data", "{tmp}/r.csv"], "no column 'text' for field 'text' (set --text-field); its columns: review, stars"),
    (["--data", "{tmp}/r.csv", "--text-field", "review"], "row 2: empty text"),
    (["A text.", "--data", "{tmp}/r.csv", "--text-field", "review"], "not both"),
    (["--data", "{tmp}/r.csv", "--text-field", "review", "--target", "gold"], "--target gold"),
    (["--data", "{tmp}/r.csv", "--text-field", "review", "--n", "0"], "--n must be at least 1"),
    (["A text.", "--text-field", "review"], "go with --data"),
])
def test_explain_refuses_a_bad_file_before_the_model_loads(args, fragment, tmp_path):
    write_csv(tmp_path / "r.csv", [{"review": "Fine.", "stars": "1"}, {"review": " ", "stars": "0"}])
    result = run_cli("explain", *NO_MODEL, *(a.format(tmp=tmp_path) for a in args))
    one_line_error(result, fragment)


def test_explain_over_a_file_explains_every_row(tiny_llama, tmp_path, monkeypatch):
    """`llmattr explain --data FILE --text-field COL`: one explanation per row (the first --n rows), in file order,
    each equal to explaining that row's text alone; --json holds the list, --html one grid per row."""
    from typer.testing import CliRunner

    import llmattr
    from llmattr.cli import app

    rows = [{"review": "A fine film.", "stars": "1"}, {"review": "Dull and long.", "stars": "0"},
            {"review": "Never again.", "stars": "0"}]
    path = write_csv(tmp_path / "r.csv", rows)
    monkeypatch.setattr("llmattr.models.loading.load_model", lambda *args, **kwargs: tiny_llama)
    out, page = tmp_path / "e.json", tmp_path / "e.html"
    result = CliRunner().invoke(app, ["explain", "--data", str(path), "--text-field", "review", "--n", "2",
                                      "--method", "input-x-gradient", "--json", str(out), "--html", str(page)])
    assert result.exit_code == 0, result.output
    records = json.loads(out.read_text())
    assert [r["example"]["text"] for r in records] == ["A fine film.", "Dull and long."]
    alone = llmattr.explain("Dull and long.", model=tiny_llama, method="input-x-gradient")
    assert records[1]["steps"][0]["raw"] == pytest.approx(alone.steps[0].raw, rel=1e-5, abs=1e-7)
    html = page.read_text()
    assert html.count('<table class="grid"') == 2  # one grid per row, each with its own tokens
    assert ">ull<" in html and ">lo<" in html  # row 2 drawn by its own token pieces
