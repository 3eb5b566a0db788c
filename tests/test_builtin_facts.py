"""Each plugin fact declared once (issue 39): the built-in metric options are the metrics' own ``Option``s, a task's
data file, dataset group, minimal pair and gold evidence are fields of the task, and "is the control" is a flag of
the method. The first test writes two plugins in the built-in style, each in its own file (a module that registers
on import, as an installed ``llmattr.plugins`` entry point would): an option two metrics share, declared once, and
a group of two next-word datasets with minimal pairs and gold evidence (BLiMP's shape); both appear in ``llmattr
evaluate --help``, in the store and in the report."""

from __future__ import annotations

import importlib.util
import json
import sqlite3
import sys
from dataclasses import fields

import pytest
from typer.testing import CliRunner

from llmattr import methods
from llmattr.api import catalog
from llmattr.cli import app
from llmattr.evaluation import EvalConfig
from llmattr.evaluation.loop import run_settings
from llmattr.evaluation.run_datasets import dataset_groups, expand_datasets
from llmattr.faithfulness import declared_options, get_metrics, unregister
from llmattr.faithfulness.ranking import REMOVAL
from llmattr.faithfulness.soft import COUPLING, SAMPLES, STEP_STRIDE
from llmattr.methods.random_baseline import RandomBaseline
from llmattr.tasks import TASKS

WIDE = {"COLUMNS": "250"}  # rich help in one line per option

SCALE_PLUGIN = '''"""Two toy metrics reading one option, declared once and shared (pi-soft and soft share samples)."""
from llmattr.faithfulness import Metric, Option, register
from llmattr.declarations import MetricRow, TableSpec
from llmattr.store import Row

SCALE = Option("scale", 2, "Toy metrics: the factor of the first step's mean and top score", positive=True)


def mean_rows(ctx, routing):
    scores = ctx.explanation.steps[0].scores
    return [Row("toy_mean", ctx.options.get("scale") * sum(scores) / len(scores))]


def top_rows(ctx, routing):
    return [Row("toy_top", ctx.options.get("scale") * max(ctx.explanation.steps[0].scores))]


for name, rows, row in (("toy-mean", mean_rows, "toy_mean"), ("toy-top", top_rows, "toy_top")):
    register(Metric(name, rows, declares=(SCALE,), tables=(TableSpec(
        f"table_{row}", f"Toy table {row}", "A toy metric.", "datasets_by_methods", (MetricRow(row, row, True),),
        order=95),)))
'''

PAIRS_PLUGIN = '''"""A group of two next-word datasets, minimal pairs with gold evidence (BLiMP's shape)."""
from llmattr.tasks import Pairing, Task, register_task


def subject(words):
    return [len(words) - 1]  # the last word of the prefix decides the verb's number


for short, display in (("a", "Toy A"), ("b", "Toy B")):
    register_task(Task(
        name=f"toy-pairs-{short}", user_template="{text}", fields=("text",), kind="lm", max_new_tokens=1,
        answer_prefix="", chat=False, data=DATA[short], label_field="target", display=display,
        group="toy-pairs", pairing=Pairing("prefix", "good", "bad"), evidence=subject))
'''

ROWS = {"a": [("The cat", "sleeps", "sleep"), ("The dogs", "bark", "barks"), ("A bird", "sings", "sing")],
        "b": [("The girls", "run", "runs"), ("My brother", "reads", "read"), ("The kids", "play", "plays")]}


def load_plugin(path, text: str):
    """Write ``text`` to ``path`` and import it (it registers on import)."""
    path.write_text(text)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def plugins(tmp_path):
    """The two plugin files, imported; unregistered again after the test."""
    data = {}
    for short, rows in ROWS.items():
        data[short] = str(tmp_path / f"toy-pairs-{short}.jsonl")
        with open(data[short], "w") as handle:
            for i, (prefix, good, bad) in enumerate(rows):
                handle.write(json.dumps({"id": f"{short}{i}", "prefix": prefix, "good": good, "bad": bad}) + "\n")
    load_plugin(tmp_path / "toy_scale.py", SCALE_PLUGIN)
    load_plugin(tmp_path / "toy_pairs.py", f"DATA = {data!r}\n" + PAIRS_PLUGIN)
    yield
    for metric in ("toy-mean", "toy-top"):
        unregister(metric)
    for short in ROWS:
        TASKS.pop(f"toy-pairs-{short}")
    sys.modules.pop("toy_scale", None)
    sys.modules.pop("toy_pairs", None)


def test_a_shared_metric_option_and_a_dataset_group_in_help_store_and_report(plugins, tiny_llama, tmp_path,
                                                                               monkeypatch):
    monkeypatch.setattr("llmattr.evaluation.loop.load_model", lambda *args, **kwargs: tiny_llama)
    runner = CliRunner()
    help_text = runner.invoke(app, ["evaluate", "--help"], env=WIDE).output
    options = help_text[help_text.index("Metric options"):]
    assert options.count("--scale") == 1 and "the factor of the first step's mean and top score (default 2)" in options
    assert "toy-pairs (toy-pairs-a, toy-pairs-b)" in help_text  # --datasets names the group and its datasets
    assert expand_datasets(["toy-pairs"]) == ["toy-pairs-a", "toy-pairs-b"]

    out = tmp_path / "r.sqlite"
    run = runner.invoke(app, ["evaluate", "--datasets", "toy-pairs", "--methods", "random,attention", "--metrics",
                              "toy-mean,toy-top,alignment", "--scale", "3", "--n", "2", "--out", str(out), "--quiet"])
    assert run.exit_code == 0, run.output
    with sqlite3.connect(out) as conn:
        settings = json.loads(conn.execute("SELECT settings FROM settings").fetchone()[0])
        stored = conn.execute("SELECT dataset, explanation FROM explanations").fetchall()
        rows = dict(conn.execute("SELECT e.explanation || r.metric, r.value FROM results r JOIN explanations e "
                                 "USING (model, dataset, example, method, params) WHERE r.metric LIKE 'toy_%'"))
        aligned = conn.execute("SELECT COUNT(*) FROM results WHERE metric = 'dot_product'").fetchone()[0]
    assert settings["scale"] == 3
    assert {dataset for dataset, _ in stored} == {"toy-pairs-a", "toy-pairs-b"} and len(stored) == 2 * 2 * 2
    for _, text in stored:  # the pair split and the evidence rule of the task, and the scale read by both metrics
        expl = json.loads(text)
        example, scores = expl["example"], expl["steps"][0]["scores"]
        words = example["text"].split()
        assert example["foil"] != example["label"] and example["evidence"] == [words[-1]]
        assert rows[text + "toy_mean"] == pytest.approx(3 * sum(scores) / len(scores))
        assert rows[text + "toy_top"] == pytest.approx(3 * max(scores))
    assert aligned == 2 * 2 * 2  # the alignment metric found the tasks' gold evidence

    report = runner.invoke(app, ["report", str(out), "--out", str(tmp_path / "rep"), "--format", "md"])
    assert report.exit_code == 0, report.output
    text = (tmp_path / "rep" / "report.md").read_text()
    assert "- scale = 3" in text  # the recorded option among the run settings
    for table in ("Toy table toy_mean", "Toy table toy_top"):
        section = text[text.index(table):]
        assert "| Toy A |" in section and "| Toy B |" in section  # the group's datasets, as BLiMP's paradigms


def test_the_built_in_metric_options_are_the_metrics_own():
    """samples, step_stride, coupling and removal are declared once (soft.py, ranking.py), shared by the metrics that
    read them, and every other place derives from the declarations."""
    declared = declared_options()
    assert [declared[o.name] for o in (SAMPLES, STEP_STRIDE, COUPLING, REMOVAL)] == [SAMPLES, STEP_STRIDE, COUPLING,
                                                                                     REMOVAL]
    assert {m.name for m in get_metrics(["pi-soft", "soft"]) if SAMPLES in m.declares} == {"pi-soft", "soft"}
    assert all(REMOVAL in m.declares for m in get_metrics(["deletion-insertion", "comp-suff", "log-odds"]))
    assert not {"samples", "step_stride", "coupling", "removal"} & {f.name for f in fields(EvalConfig)}

    help_text = CliRunner().invoke(app, ["evaluate", "--help"], env=WIDE).output
    options = help_text[help_text.index("Metric options"):]
    for flag, text in (("--samples", "(default 15)"), ("--step-stride", "(default 5)"),
                       ("--coupling", "(default coupled; one of coupled, independent)"),
                       ("--removal", "(default zero; one of zero, delete)")):
        line = next(line for line in options.splitlines() if flag in line)
        assert text in line


def test_old_spellings_of_the_built_in_options_keep_reading(tiny_llama, tmp_path):
    """``EvalConfig(samples=2)``, a TOML config's keys and an old store's recorded settings read as before."""
    cfg = EvalConfig(datasets=["sst2", "imdb"], methods=["grad-ellm", "attention", "random"],
                     metrics=["pi-soft", "soft", "deletion-insertion", "comp-suff", "log-odds"],
                     routing="both", n=3, samples=2, step_stride=5, device="cpu")  # tests/data/make_report_store.py
    assert cfg.options == {"samples": 2, "step_stride": 5} and cfg.option("coupling") == "coupled"
    with sqlite3.connect("tests/data/report_store.sqlite") as conn:  # written before the options were declared
        old = json.loads(conn.execute("SELECT settings FROM settings").fetchone()[0])
    # the same settings but the retain rule, which the old store did not record (it reads as "clip", so pi-soft
    # does not resume there: tests/test_store.py)
    assert run_settings(cfg, get_metrics(cfg.metrics), tiny_llama) == {**old, "retain_rule": "exact"}
    assert run_settings(cfg, get_metrics(["soft", "comp-suff"]), tiny_llama).items() <= old.items()

    config = tmp_path / "run.toml"
    config.write_text('samples = 3\nstep-stride = 2\ncoupling = "independent"\nremoval = "delete"\n')
    loaded = EvalConfig.from_toml(config)
    loaded.validate()
    assert loaded.options == {"samples": 3, "step_stride": 2, "coupling": "independent", "removal": "delete"}
    assert loaded.metric_options().get("removal") == "delete" and loaded.metric_options().get("samples") == 3
    with pytest.raises(TypeError, match="unknown keyword"):
        EvalConfig(sampels=2)


def test_the_control_is_a_flag_of_the_method():
    """The report's control comes from the method (``control``), through the catalog; the random method's family
    is the report's word for it."""
    assert RandomBaseline.control and RandomBaseline.family == "control"
    assert catalog().controls == tuple(name for name, cls in methods.REGISTRY.items() if cls.control) == ("random",)
    listed = json.loads(CliRunner().invoke(app, ["methods", "--json"]).output)
    assert next(m for m in listed if m["name"] == "random")["family"] == "control"


def test_blimp_is_a_group_of_tasks():
    assert dataset_groups()["blimp"] == ("blimp-ana", "blimp-dna", "blimp-dnaa", "blimp-darn", "blimp-rpsv")
    assert all(TASKS[name].pairing and TASKS[name].evidence for name in dataset_groups()["blimp"])
