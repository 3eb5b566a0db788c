"""Slurm where it is (srun tasks, job arrays, arrays of srun steps) and ``llmattr status`` on running shards."""

from __future__ import annotations

import json
import re
import shlex
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from conftest import build_tiny, make_tiny_tokenizer
from llmattr.cli import app
from llmattr.errors import LlmattrError
from llmattr.evaluation import EvalConfig, run, shard_of
from llmattr.faithfulness import METRICS, Metric, register
from llmattr.status import read_statuses
from llmattr.store import MetricOutput, Row, Store, Unit

SLURM = ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_STEP_NUM_TASKS", "SLURM_ARRAY_TASK_ID", "SLURM_ARRAY_TASK_COUNT",
         "SLURM_ARRAY_TASK_MIN", "SLURM_ARRAY_TASK_MAX", "SLURM_ARRAY_TASK_STEP", "RANK", "WORLD_SIZE")


@pytest.fixture
def env(monkeypatch):
    """Set a Slurm-like environment (no other launcher's variables left from the caller's)."""
    for name in SLURM:
        monkeypatch.delenv(name, raising=False)

    def setenv(**values):
        for name in SLURM:
            monkeypatch.delenv(name, raising=False)
        for name, value in values.items():
            monkeypatch.setenv(name, str(value))
        return shard_of(EvalConfig())
    return setenv


def test_slurm_environments_give_the_shard(env):
    assert env() == (0, 1)
    assert env(SLURM_PROCID=2, SLURM_NTASKS=4) == (2, 4)  # srun -n 4
    assert env(SLURM_PROCID=1, SLURM_NTASKS=8, SLURM_STEP_NUM_TASKS=2) == (1, 2)  # srun -n 2 in an 8-task job
    assert env(SLURM_ARRAY_TASK_ID=5, SLURM_ARRAY_TASK_MIN=1, SLURM_ARRAY_TASK_MAX=8,
               SLURM_ARRAY_TASK_COUNT=8) == (4, 8)  # --array=1-8
    assert env(SLURM_ARRAY_TASK_ID=6, SLURM_ARRAY_TASK_MIN=0, SLURM_ARRAY_TASK_MAX=14,
               SLURM_ARRAY_TASK_STEP=2) == (3, 8)  # --array=0-14:2, no count given
    assert env(SLURM_ARRAY_TASK_ID=3, SLURM_ARRAY_TASK_COUNT=4, SLURM_PROCID=0, SLURM_NTASKS=1,
               SLURM_STEP_NUM_TASKS=1) == (3, 4)  # each array task runs srun with one task
    assert env(SLURM_ARRAY_TASK_ID=1, SLURM_ARRAY_TASK_COUNT=2, SLURM_PROCID=1,
               SLURM_STEP_NUM_TASKS=2) == (3, 4)  # an array of 2 tasks, each srun -n 2
    assert env(SLURM_PROCID=2, SLURM_NTASKS=4, RANK=1, WORLD_SIZE=2) == (1, 2)  # torchrun first
    assert shard_of(EvalConfig(shard="0/3")) == (0, 3)  # --shard before everything
    with pytest.raises(LlmattrError, match="not on the array's grid"):
        env(SLURM_ARRAY_TASK_ID=5, SLURM_ARRAY_TASK_MIN=0, SLURM_ARRAY_TASK_STEP=2, SLURM_ARRAY_TASK_COUNT=8)


@pytest.fixture
def cheap_metric():
    """A cheap deterministic metric: fails (one line) for the second unit it sees, interrupts the run (Ctrl-C)
    at the ``stop``-th; ``calls`` counts them."""
    calls = {"n": 0, "stop": None}

    def compute(ctx, routing):
        calls["n"] += 1
        if calls["n"] == calls["stop"]:
            raise KeyboardInterrupt
        if calls["n"] == 2:
            raise LlmattrError("text longer than the model's context")
        return [Row("cheap_mean", float(ctx.explanation.score_matrix().mean()))]

    register(Metric("cheap", compute))
    yield calls
    METRICS.pop("cheap")


def config(tmp_path, n=4) -> EvalConfig:
    return EvalConfig(datasets=["sst2"], methods=["random"], metrics=["cheap"], n=n, out=str(tmp_path / "r.sqlite"))


def examples(path) -> set[str]:
    with sqlite3.connect(path) as conn:
        return {row[0] for row in conn.execute("SELECT example FROM done")}


def test_each_srun_or_array_task_takes_its_own_shard_and_store(env, tiny_llama, tmp_path, cheap_metric,
                                                               shared_data):  # noqa: F811
    cheap_metric["n"] = -10  # no failure
    (tmp_path / "srun").mkdir(), (tmp_path / "array").mkdir()
    outs = []
    for rank in range(2):
        env(SLURM_PROCID=rank, SLURM_NTASKS=2)
        outs.append(run(config(tmp_path / "srun"), lm=tiny_llama, progress=False).out)
    for place in range(2):
        env(SLURM_ARRAY_TASK_ID=place + 1, SLURM_ARRAY_TASK_MIN=1, SLURM_ARRAY_TASK_MAX=2)
        outs.append(run(config(tmp_path / "array"), lm=tiny_llama, progress=False).out)
    assert [p.name for p in outs] == ["r.rank0.sqlite", "r.rank1.sqlite"] * 2
    srun, array = [examples(p) for p in outs[:2]], [examples(p) for p in outs[2:]]
    assert srun == array and not srun[0] & srun[1] and len(srun[0] | srun[1]) == 4


def test_two_processes_taking_one_shard_are_refused_in_one_line(env, tiny_llama, tmp_path, cheap_metric,
                                                                shared_data):  # noqa: F811
    env(SLURM_ARRAY_TASK_ID=0, SLURM_ARRAY_TASK_COUNT=1)  # both believe they are shard 0 of 1
    with Store(tmp_path / "r.sqlite"):  # the other process, still running
        with pytest.raises(LlmattrError, match="two processes took the same shard") as err:
            run(config(tmp_path), lm=tiny_llama, progress=False)
    assert "\n" not in str(err.value) and "r.sqlite" in str(err.value) and "SLURM_PROCID" in str(err.value)


def interrupted(tmp_path, tiny_llama, cheap_metric, rank: int, world: int):
    """Shard ``rank/world`` of 4 examples, stopped (Ctrl-C) at its third unit: 1 done, 1 failed, 2 left."""
    cheap_metric.update(n=0, stop=3)
    cfg = EvalConfig.from_mapping({"shard": f"{rank}/{world}", "n": 4 * world}, config(tmp_path))
    with pytest.raises(KeyboardInterrupt):
        run(cfg, lm=tiny_llama, progress=False)


def test_status_of_an_interrupted_run(tiny_llama, tmp_path, cheap_metric, shared_data):
    interrupted(tmp_path, tiny_llama, cheap_metric, 0, 1)
    store = tmp_path / "r.sqlite"
    with Store(store):  # read while a writer holds the store
        (status,) = read_statuses([str(store)])
    (line,) = status.lines
    assert (line.dataset, line.method, line.done, line.total, line.failed) == ("sst2", "random", 1, 4, 1)
    assert status.failures == [f"sst2/{failure} random: text longer than the model's context"
                               for failure in _failed(store)]
    assert status.eta_s == pytest.approx(3 * line.seconds)  # 3 units left at the done unit's time
    result = CliRunner().invoke(app, ["status", str(store)], terminal_width=200)
    assert result.exit_code == 0, result.output
    assert "1/4" in result.output and "text longer than the model's context" in result.output
    assert "1 store(s): 1/4 units done, 1 failed" in result.output
    with Store(store) as writer:  # a run writes the failed unit: read from the write-ahead log while it runs
        (model, params), (example,) = _unit(store), _failed(store)
        writer.write(Unit(model, "sst2", example, "random", params), "{}", 0.5,
                     [MetricOutput("cheap", "none", 0.5, [Row("cheap_mean", 0.5)])])
        (status,) = read_statuses([str(store)])
        assert (status.done, status.total, status.failures) == (2, 4, [])


def _unit(store) -> tuple[str, str]:
    with sqlite3.connect(store) as conn:
        return conn.execute("SELECT model, params FROM planned").fetchone()


def _failed(store) -> list[str]:
    with sqlite3.connect(store) as conn:
        return [row[0] for row in conn.execute("SELECT example FROM failed")]


def test_status_of_a_glob_of_shards_as_json(tiny_llama, tmp_path, cheap_metric, shared_data):
    for rank in range(2):
        interrupted(tmp_path, tiny_llama, cheap_metric, rank, 2)
    result = CliRunner().invoke(app, ["status", str(tmp_path / "r.rank*.sqlite"), "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert [s["path"].rsplit("/", 1)[1] for s in data["stores"]] == ["r.rank0.sqlite", "r.rank1.sqlite"]
    assert [(s["done"], s["total"], s["failed"]) for s in data["stores"]] == [(1, 4, 1), (1, 4, 1)]
    assert (data["done"], data["total"]) == (2, 8)
    assert data["eta_s"] == max(s["eta_s"] for s in data["stores"]) > 0
    assert data["stores"][0]["lines"][0]["method"] == "random"


def test_status_of_a_store_without_a_plan(tiny_llama, tmp_path, cheap_metric, shared_data):
    """A store written before the plan was recorded: done counted, total unknown."""
    interrupted(tmp_path, tiny_llama, cheap_metric, 0, 1)
    with sqlite3.connect(tmp_path / "r.sqlite") as conn:
        conn.execute("DROP TABLE planned")
        conn.execute("DROP TABLE failed")
    (status,) = read_statuses([str(tmp_path / "r.sqlite")])
    assert (status.done, status.total, status.eta_s, status.failures) == (1, None, None, [])


def test_status_reads_a_schema_2_store_without_changing_it(tmp_path):
    store = tmp_path / "old.sqlite"
    shutil.copy(Path(__file__).parent / "data" / "report_store.sqlite", store)
    before = store.read_bytes()
    (status,) = read_statuses([str(store)])
    assert (status.done, status.total) == (18, None)
    assert store.read_bytes() == before


@pytest.mark.parametrize("kind", ["missing", "text", "foreign"])
def test_status_refuses_a_path_that_is_not_a_store(tmp_path, kind):
    path = tmp_path / "x.sqlite"
    if kind == "text":
        path.write_text("not a database\n" * 50)
    elif kind == "foreign":
        with sqlite3.connect(path) as conn:
            conn.execute("CREATE TABLE orders (id INTEGER)")
    done = subprocess.run([sys.executable, "-c", "from llmattr.cli import main; main()", "status", str(path)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert len(done.stderr.strip().splitlines()) == 1 and str(path.name) in done.stderr


def sbatch_scripts() -> list[str]:
    """The bash blocks of docs/evaluate.md that are sbatch scripts (they hold ``#SBATCH`` lines)."""
    doc = (Path(__file__).parents[1] / "docs" / "evaluate.md").read_text(encoding="utf-8")
    return [block for block in re.findall(r"```bash\n(.*?)```", doc, flags=re.S) if "#SBATCH" in block]


def slurm_tasks(script: str) -> list[dict]:
    """The environment Slurm gives each task of the script: ``srun`` under ``--ntasks=N``, or one task per array
    index of the ``sbatch --array=A-B`` its comment says to submit it with."""
    if ntasks := re.search(r"#SBATCH .*--ntasks=(\d+)", script):
        n = int(ntasks[1])
        return [{"SLURM_PROCID": i, "SLURM_NTASKS": n, "SLURM_STEP_NUM_TASKS": n} for i in range(n)]
    first, last = map(int, re.search(r"sbatch --array=(\d+)-(\d+)", script).groups())
    return [{"SLURM_ARRAY_TASK_ID": i, "SLURM_ARRAY_TASK_MIN": first, "SLURM_ARRAY_TASK_MAX": last,
             "SLURM_ARRAY_TASK_COUNT": last - first + 1} for i in range(first, last + 1)]


def script_command(script: str) -> list[str]:
    """The script's command line (continuations joined, comments dropped), without ``srun``."""
    lines = [line for line in script.replace("\\\n", " ").splitlines() if line and not line.startswith("#")]
    (line,) = lines
    words = shlex.split(line, comments=True)
    return words[1:] if words[0] == "srun" else words


@pytest.fixture(scope="module")
def boolq_folder(tmp_path_factory) -> Path:
    """A tiny random Llama folder whose tokenizer has BoolQ's label words as single tokens."""
    folder = tmp_path_factory.mktemp("models") / "tiny-llama"
    tokenizer = make_tiny_tokenizer()
    tokenizer.add_tokens(["true", "false"])
    build_tiny("llama", tokenizer, max_position_embeddings=2048).model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.mark.parametrize("which", [0, 1], ids=["srun-ntasks", "job-array"])
def test_the_sbatch_examples_of_the_docs_run_as_written(which, env, boolq_folder, tmp_path, monkeypatch,
                                                        shared_data):
    """docs/evaluate.md's two sbatch scripts, each task run in the environment Slurm gives it: every task takes its
    own shard and store, and together they do every unit once. The model and ``--n`` are the only words changed
    (a tiny model folder and one example per dataset for the 8B model and 500)."""
    script = sbatch_scripts()[which]
    words = script_command(script)
    assert words[:2] == ["llmattr", "evaluate"] and "--shard" not in words
    words[words.index("--model") + 1], words[words.index("--n") + 1] = str(boolq_folder), "1"
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs").mkdir()
    tasks = slurm_tasks(script)
    for task in tasks:
        env(**task)
        result = CliRunner().invoke(app, words[1:], terminal_width=200)
        assert result.exit_code == 0, result.output
    stores = sorted((tmp_path / "runs").glob("llama.rank*.sqlite"), key=lambda p: int(p.name[10:-7]))
    assert [p.name for p in stores] == [f"llama.rank{i}.sqlite" for i in range(len(tasks))]
    done = [examples(p) for p in stores]
    assert sum(map(len, done)) == len(set().union(*done)) == 3  # one example of imdb, sst2, boolq, each once
    methods = words[words.index("--methods") + 1].split(",")
    units = [unit for p in stores for unit in done_units(p)]
    assert len(units) == len(set(units)) == 3 * len(methods)  # every (example, method) once, in one store


def done_units(path) -> list[tuple[str, str]]:
    with sqlite3.connect(path) as conn:
        return conn.execute("SELECT DISTINCT example, method FROM done").fetchall()
