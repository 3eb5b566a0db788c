"""A user's own files (issue 35): one reader per format (llmattr.tasks.datasets) shared by explain --data,
evaluate --data, evaluate-scores, finetune --data and --shots-from refuses every bad file (not UTF-8, a line that
is not JSON, a CSV row with the wrong number of fields, a folder, an empty file, a missing column) in one line
naming the file, the line and the fix, exit 2, before the model loads; a fuzz test feeds the readers random bytes
and truncated files. evaluate accounts for every row: --n all, a user's file evaluated whole by default, the
balancing limit said right, empty texts refused before the load, exit 1 after a failed unit."""

from __future__ import annotations

import importlib.util
import random

import pytest
from typer.testing import CliRunner

from llmattr.cli import app
from llmattr.errors import LlmattrError
from llmattr.evaluation import EvalConfig
from llmattr.readers import read_json, read_numbered_rows
from llmattr.tasks.datasets import balanced_limit, sample
from llmattr.tasks.files import read_file_examples, read_file_texts
from test_cli_checks import NO_MODEL, one_line_error, run_cli

VALID = {
    "r.jsonl": b'{"review": "A fine film.", "label": "positive"}\n{"review": "Dull.", "label": "negative"}\n',
    "r.json": b'[{"review": "A fine film.", "label": "positive"}, {"review": "Dull.", "label": "negative"}]',
    "r.csv": b'review,label\n"A fine, long film.",positive\nDull.,negative\n',
    "r.tsv": b"review\tlabel\nA fine film.\tpositive\nDull.\tnegative\n",
}

BAD = [  # (file name, bytes, what the one line says)
    ("l.csv", b'review,sentiment\n"Caf\xe9",pos\n', "line 2 is not UTF-8 (byte 0xe9); save the file as UTF-8"),
    ("b.jsonl", b'{"review":"a"}\n{"review":"b"\n', "line 2 is not JSON (Expecting ',' delimiter, column 14); fix"),
    ("b.jsonl", b'{"review":"a"}\n\n[1, 2]\n', "line 3 is a list, not an object of columns"),
    ("i.jsonl", b'{"review":"a"}\n7\n', "line 2 is an int, not an object of columns"),
    ("b.json", b'{"review": "a",\n "x": }', "line 2 is not JSON"),
    ("b.json", b'"just text"', "holds a list of objects (one per row), not a str"),
    ("b.csv", b"review,label\nA,positive\nB,negative,extra\n", "line 3 has 3 field(s), the header 2; quote"),
    ("b.tsv", b"review\tlabel\nA\n", "line 2 has 1 field(s), the header 2; quote a field that holds a tab"),
    ("e.csv", b"", "is empty; give a file with a header"),
    ("e.jsonl", b"  \n\n", "is empty"),
    ("h.csv", b"review,label\n", "no rows; add one row per example"),
    ("q.csv", b'review,label\n"open,positive\nDull.,negative\n', "line 3 has 1 field(s), the header 2"),
    ("big.csv", b'review,label\n"' + b"x" * 200_000 + b'",positive\n', "is not CSV (field larger than field limit"),
    ("x.txt", b"a", "unknown data format"),
]


@pytest.mark.parametrize("name, content, fragment", BAD)
def test_every_reader_refuses_a_bad_file_in_one_line_naming_file_line_and_fix(name, content, fragment, tmp_path):
    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(LlmattrError) as err:
        read_numbered_rows(path)
    message = str(err.value)
    assert fragment in message and str(path) in message and "\n" not in message


def test_folders_missing_files_and_missing_columns(tmp_path):
    (tmp_path / "d.csv").mkdir()
    with pytest.raises(LlmattrError, match=r"d.csv is a folder; give the data file itself"):
        read_numbered_rows(tmp_path / "d.csv")
    with pytest.raises(LlmattrError, match="data file not found"):
        read_numbered_rows(tmp_path / "none.csv")
    (tmp_path / "folder").mkdir()  # a folder or a missing file is named as such whatever its suffix
    with pytest.raises(LlmattrError, match=r"folder is a folder; give the data file itself"):
        read_numbered_rows(tmp_path / "folder")
    with pytest.raises(LlmattrError, match="data file not found"):
        read_numbered_rows(tmp_path / "none")
    path = tmp_path / "r.jsonl"
    path.write_text('{"review": "a", "label": "positive"}\n\n{"text": "b", "label": "negative"}\n')
    with pytest.raises(LlmattrError, match=r"r.jsonl: line 3 has no column 'review' .*--text-field"):
        read_file_examples("sentiment", path, "review")  # the line number counts the blank line
    with pytest.raises(LlmattrError, match=r"scores.json is a folder; give the scores file itself"):
        (tmp_path / "scores.json").mkdir()
        read_json(tmp_path / "scores.json", "scores file")


def test_a_bom_and_crlf_file_reads(tmp_path):
    path = tmp_path / "w.csv"
    path.write_bytes(b"\xef\xbb\xbfreview,label\r\nFine.,positive\r\n")
    assert read_file_texts("sentiment", path, "review") == ["Fine."]
    path = tmp_path / "w.jsonl"
    path.write_text('{"text": "a\u2028b", "label": "positive"}\n', encoding="utf-8")  # U+2028 is no line end
    assert read_file_texts("sentiment", path) == ["a\u2028b"]


def fuzz_cases(n: int = 300):
    """Deterministic random bytes and truncations (and single-byte corruptions) of every valid file."""
    rng = random.Random(35)
    for i in range(n):
        name, valid = list(VALID.items())[i % len(VALID)]
        kind = i % 3
        if kind == 0:
            content = bytes(rng.randrange(256) for _ in range(rng.randrange(40)))
        elif kind == 1:
            content = valid[:rng.randrange(len(valid))]
        else:
            at = rng.randrange(len(valid))
            content = valid[:at] + bytes([rng.randrange(256)]) + valid[at + 1:]
        yield i, name, content


def test_fuzz_the_readers_see_only_one_line_refusals(tmp_path):
    """300 files: each reads, or is refused by one LlmattrError line naming the file; no other exception."""
    refused = 0
    for i, name, content in fuzz_cases():
        path = tmp_path / f"{i}-{name}"
        path.write_bytes(content)
        for read in (lambda p: read_file_examples("sentiment", p, "review"),
                     lambda p: read_file_texts("sentiment", p, "review"),
                     lambda p: read_json(p, "scores file")):
            try:
                read(path)
            except LlmattrError as err:
                refused += 1
                assert "\n" not in str(err) and str(path) in str(err), (content, err)
    assert refused > 300  # most of them are bad


def test_fuzz_explain_data_through_the_cli(tmp_path, monkeypatch):
    """`llmattr explain --data` on 90 fuzzed files: a one-line LlmattrError before the model loads, or (a file
    that still reads) the model load, never a traceback."""
    def no_load(*args, **kwargs):
        raise LlmattrError("would load the model")

    monkeypatch.setattr("llmattr.models.loading.load_model", no_load)
    runner = CliRunner()
    for i, name, content in fuzz_cases(90):
        path = tmp_path / f"{i}-{name}"
        path.write_bytes(content)
        result = runner.invoke(app, ["explain", "--data", str(path), "--text-field", "review"])
        assert isinstance(result.exception, LlmattrError), (content, result.exception, result.output)
        assert "\n" not in str(result.exception)


@pytest.mark.parametrize("command, content, fragment", [
    (["explain", "--data", "{f}", "--text-field", "review"], b'review,sentiment\n"Caf\xe9",pos\n', "not UTF-8"),
    (["explain", "--data", "{f}", "--text-field", "review"], b'{"review":"a"}\n{"review":"b"\n', "not JSON"),
    (["explain", "hi", "--shots", "1", "--shots-from", "{f}"], b'{"text":"a"}\n{"text":\n', "line 2 is not JSON"),
    (["evaluate", "--data", "{f}", "--text-field", "review", "--out", "{tmp}/o.sqlite"],
     b'review,label\n"Caf\xe9",positive\n', "not UTF-8"),
    (["finetune", "--task", "sentiment", "--data", "{f}", "--text-field", "review", "--out", "{tmp}/ft"],
     b'{"review":"a"}\n{"review":"b"\n', "line 2 is not JSON"),
    (["evaluate-scores", "{f}"], b'[{"text": "a", "scores": [1]},\n', "line 2 is not JSON"),
    (["explain", "--data", "{f}", "--text-field", "review"], b'{"review":"a"}\n{"review":null}\n',
     "line 2 has no value (null) in column 'review'"),  # not explained as the text "None"
    (["evaluate", "--data", "{f}", "--text-field", "review", "--out", "{tmp}/o.sqlite"],
     b'{"review":"a","label":null}\n', "line 1 has no value (null) in column 'label'"),
])
def test_the_cli_refuses_a_bad_file_in_one_line_exit_2(command, content, fragment, tmp_path):
    path = tmp_path / ("f.json" if command[0] == "evaluate-scores" else
                       "f.csv" if content.startswith(b"review,") else "f.jsonl")
    path.write_bytes(content)
    model = [] if command[0] == "evaluate-scores" else NO_MODEL
    result = run_cli(*(a.format(f=path, tmp=tmp_path) for a in command), *model)
    one_line_error(result, fragment)
    assert str(path) in result.stderr


def test_a_folder_given_as_data_is_called_a_folder(tmp_path):
    (tmp_path / "d.csv").mkdir()
    one_line_error(run_cli("finetune", *NO_MODEL, "--data", str(tmp_path / "d.csv"), "--out", str(tmp_path / "f")),
                   "is a folder; give the data file itself")


def test_finetune_messages_name_the_right_task_and_extra(tmp_path):
    with pytest.raises(LlmattrError) as err:
        from llmattr.finetuning import FinetuneConfig
        FinetuneConfig(task="generate").validate()
    assert "STS-B" not in str(err.value) and "generate is a generation task" in str(err.value)
    with pytest.raises(LlmattrError, match="paper 003's regression head: --task stsb-regression --head regression"):
        FinetuneConfig(task="stsb").validate()
    if importlib.util.find_spec("peft") is None or importlib.util.find_spec("bitsandbytes") is not None:
        pytest.skip("needs peft and no bitsandbytes")
    result = run_cli("finetune", *NO_MODEL, "--load-in-4bit", "--lora-r", "4", "--out", str(tmp_path / "f"))
    one_line_error(result, "pip install 'llmattr[quant]'")  # the error line escapes rich markup


def test_the_balancing_limit_is_the_real_one():
    examples = [{"id": i, "label": "Positive"} for i in range(4)] + [{"id": 9, "label": "Negative"}]
    assert balanced_limit([4, 1]) == 3 and balanced_limit([1, 4]) == 2 and balanced_limit([5, 5]) == 10
    assert len(sample(examples, 3, classes=("Positive", "Negative"))) == 3
    with pytest.raises(LlmattrError, match=r"ask for n <= 3, or for every row, unbalanced \(--n all\)"):
        sample(examples, 4, classes=("Positive", "Negative"))


def test_n_all_and_the_default_n(tmp_path):
    assert EvalConfig().sample_size() == 50 and EvalConfig(n="all").sample_size() is None
    assert EvalConfig(data="x.csv").sample_size() is None  # a user's file: every row without --n
    cfg = EvalConfig(n="7", out=str(tmp_path / "x.sqlite"))
    cfg.validate()
    assert cfg.n == 7 and cfg.sample_size() == 7
    for bad, fragment in (("some", "--n takes a number of examples or all"), ("0", "--n must be at least 1")):
        with pytest.raises(LlmattrError, match=fragment):
            EvalConfig(n=bad).validate()
    with pytest.raises(LlmattrError, match="--data evaluates your file x.csv; --datasets sst2 names shipped"):
        EvalConfig(data="x.csv", datasets=["sst2"]).validate()


UNBALANCED = "review,label\nGreat.,positive\nFine.,positive\nSuperb.,positive\nGood.,positive\nAwful.,negative\n"


def evaluate_cli(tiny_llama, monkeypatch, tmp_path, *args):
    """`llmattr evaluate --data` in process on the tiny model (no load), random attributions, comp-suff."""
    monkeypatch.setattr("llmattr.evaluation.loop._load", lambda *a, **k: tiny_llama)
    out = tmp_path / "r.sqlite"
    result = CliRunner().invoke(app, ["evaluate", "--data", str(tmp_path / "u.csv"), "--text-field", "review",
                                      "--methods", "random", "--metrics", "comp-suff", "--out", str(out), "--quiet",
                                      *args])
    return result, out


def stored_examples(out):
    import sqlite3
    with sqlite3.connect(out) as conn:
        return {row[0] for row in conn.execute("SELECT DISTINCT example FROM explanations")}


@pytest.mark.parametrize("args", [[], ["--n", "all"]])
def test_evaluate_a_users_whole_unbalanced_file(args, tiny_llama, monkeypatch, tmp_path):
    (tmp_path / "u.csv").write_text(UNBALANCED)
    result, out = evaluate_cli(tiny_llama, monkeypatch, tmp_path, *args)
    assert result.exit_code == 0, result.output
    assert stored_examples(out) == {f"u-{i}" for i in range(5)}


def test_evaluate_n_beyond_the_balance_says_the_real_limit(tiny_llama, monkeypatch, tmp_path):
    (tmp_path / "u.csv").write_text(UNBALANCED)
    result, _ = evaluate_cli(tiny_llama, monkeypatch, tmp_path, "--n", "4")
    assert isinstance(result.exception, LlmattrError)
    assert "ask for n <= 3, or for every row, unbalanced (--n all)" in str(result.exception)


def test_evaluate_exits_1_after_a_failed_unit_and_says_how_to_retry(tiny_llama, monkeypatch, tmp_path):
    from llmattr.evaluation import loop

    (tmp_path / "u.csv").write_text(UNBALANCED)
    real = loop._run_unit

    def fail_one(lm, item, *args):
        if item.unit.example == "u-2":
            raise LlmattrError("a refusal")
        return real(lm, item, *args)

    monkeypatch.setattr(loop, "_run_unit", fail_one)
    result, out = evaluate_cli(tiny_llama, monkeypatch, tmp_path)
    assert result.exit_code == 1, result.output
    assert stored_examples(out) == {"u-0", "u-1", "u-3", "u-4"}  # every good one is written
    last = [line for line in result.output.splitlines() if line.strip()][-1]
    assert last.startswith("1 unit(s) failed") and "run the same command again" in last


def test_evaluate_refuses_an_empty_text_before_the_model_loads(tmp_path):
    (tmp_path / "u.csv").write_text("review,label\nFine.,positive\n  ,negative\n")
    result = run_cli("evaluate", *NO_MODEL, "--data", str(tmp_path / "u.csv"), "--text-field", "review",
                     "--out", str(tmp_path / "o.sqlite"))
    one_line_error(result, "row 2: empty text")
    assert not (tmp_path / "o.sqlite").exists()


def test_evaluate_refuses_datasets_beside_data(tmp_path):
    (tmp_path / "u.csv").write_text(UNBALANCED)
    result = run_cli("evaluate", *NO_MODEL, "--data", str(tmp_path / "u.csv"), "--datasets", "sst2",
                     "--out", str(tmp_path / "o.sqlite"))
    one_line_error(result, "--datasets sst2 names shipped ones: give one of them")


def test_an_old_toml_config_reads_its_n(tmp_path):
    config = tmp_path / "c.toml"
    config.write_text('datasets = "sst2"\nn = 20\n')
    cfg = EvalConfig.from_toml(config)
    cfg.validate()
    assert cfg.sample_size() == 20 and cfg.dataset_names() == ["sst2"]
