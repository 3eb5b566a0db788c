"""The evaluation loop: names and config, sharding, resume after SIGKILL, shards merged == one process."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from conftest import build_tiny, strip_timings
from llmattr.api import catalog
from llmattr.errors import LlmattrError
from llmattr.evaluation import EvalConfig, expand_methods, parse_method, run, shard_of, shard_path
from llmattr.faithfulness import METRICS, Metric, MetricContext, register
from llmattr.report import build_report
from llmattr.store import Row

SMALL = dict(datasets=["sst2"], methods=["grad-ellm", "random"], metrics=["pi-soft"], n=2, samples=2,
             device="cpu")


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory, tiny_tokenizer) -> Path:
    """A tiny random Llama saved as a model folder, the way a user passes a local model."""
    folder = tmp_path_factory.mktemp("models") / "tiny-llama"
    lm = build_tiny("llama", tiny_tokenizer, max_position_embeddings=2048)
    lm.model.save_pretrained(folder)
    tiny_tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture
def toy_metric():
    """A cheap deterministic metric adapter (mean retain probability), registered for one test."""
    adapter = register(Metric(
        "toy", lambda ctx, routing: [Row("toy_mean", float(ctx.explanation.score_matrix().mean()))]))
    yield adapter
    METRICS.pop("toy")


def cli(*args: str) -> list[str]:
    return [sys.executable, "-c", "from llmattr.cli import main; main()", *args]


def evaluate_args(folder: Path, out: Path, *extra: str) -> list[str]:
    return cli("evaluate", "--model", str(folder), "--datasets", "sst2", "--methods", "grad-ellm,random",
               "--metrics", "pi-soft", "--n", "2", "--samples", "2", "--device", "cpu", "--out", str(out),
               "--quiet", *extra)


def count_done(path: Path) -> int:
    """Finished units in a store another process is writing (0 while it does not exist yet)."""
    if not path.exists():
        return 0
    conn = sqlite3.connect(path, timeout=30)
    try:
        return conn.execute("SELECT count(*) FROM done").fetchone()[0]
    except sqlite3.OperationalError:  # tables not created yet
        return 0
    finally:
        conn.close()


def report_files(stores: list[Path], out: Path) -> dict[str, bytes]:
    """Every report file except the timing table, the HTML with its timing section stripped."""
    _, written = build_report(stores, out, ("md", "csv", "html"), catalog=catalog())
    files = {}
    for path in written:
        if path.stem == "table6_time":
            continue
        data = path.read_bytes()
        files[path.name] = strip_timings(data.decode()).encode() if path.suffix == ".html" else data
    return files


@pytest.fixture(scope="module")
def reference(tiny_folder, tmp_path_factory, shared_data) -> dict[str, bytes]:
    """The report of one uninterrupted single-process run."""
    out = tmp_path_factory.mktemp("ref")
    summary = run(EvalConfig(model=str(tiny_folder), out=str(out / "r.sqlite"), **SMALL), progress=False)
    assert summary.computed == 4 and not summary.failed
    files = report_files([out / "r.sqlite"], out / "report")
    assert {"report.md", "report.html", "table1_pi_soft_auc.csv", "fig3_pi_curves_sst2_dynamic.png"} <= set(files)
    return files


# ---------------------------------------------------------------------------------------- names, config
def test_unknown_names_list_the_valid_ones():
    with pytest.raises(LlmattrError, match=r"unknown metric 'nope'; valid: .*pi-soft"):
        run(EvalConfig(metrics=["nope"]))
    with pytest.raises(LlmattrError, match=r"unknown method 'nope'; valid: .*grad-ellm"):
        run(EvalConfig(methods=["nope"]))
    with pytest.raises(LlmattrError, match=r"unknown dataset 'nope'; valid: .*sst2"):
        run(EvalConfig(datasets=["nope"]))
    with pytest.raises(LlmattrError, match="unknown routing"):
        run(EvalConfig(routing="sideways"))
    with pytest.raises(LlmattrError, match="--coupling must be one of coupled, independent; got 'shared'"):
        run(EvalConfig(coupling="shared"))


def test_method_specs_and_layer_sweep():
    spec = parse_method("grad-ellm:layers=4:attention=softmax")
    assert spec.params["layers"] == 4 and spec.params["attention"] == "softmax"
    assert spec.label == "grad-ellm:attention=softmax:layers=4"
    specs = expand_methods(["grad-ellm", "attention"], layers=["1", "4", "all"])
    assert [s.label for s in specs] == ["grad-ellm:layers=1", "grad-ellm:layers=4", "grad-ellm", "attention"]
    with pytest.raises(LlmattrError, match="key=value"):
        parse_method("grad-ellm:layers")


def test_config_file_and_overrides(tmp_path):
    path = tmp_path / "run.toml"
    path.write_text('model = "m"\ndatasets = ["sst2", "imdb"]\nmethods = "grad-ellm,attention"\nn = 7\n'
                    'routing = "both"\n')
    cfg = EvalConfig.from_mapping({"n": 3, "seed": None}, EvalConfig.from_toml(path))
    assert (cfg.model, cfg.datasets, cfg.methods, cfg.n, cfg.seed) == ("m", ["sst2", "imdb"],
                                                                      ["grad-ellm", "attention"], 3, 0)
    assert cfg.routings == ("dynamic", "fixed")
    path.write_text("bogus = 1\n")
    with pytest.raises(LlmattrError, match="unknown config key"):
        EvalConfig.from_toml(path)


def test_shards(monkeypatch):
    assert shard_of(EvalConfig(shard="1/3")) == (1, 3)
    monkeypatch.setenv("RANK", "2")
    monkeypatch.setenv("WORLD_SIZE", "4")
    assert shard_of(EvalConfig()) == (2, 4)
    with pytest.raises(LlmattrError, match="out of range"):
        shard_of(EvalConfig(shard="3/3"))
    assert shard_path("out/results.sqlite", 2, 4) == Path("out/results.rank2.sqlite")
    assert shard_path("results.sqlite", 0, 1) == Path("results.sqlite")


# ---------------------------------------------------------------------------------------- the loop
def test_rerun_skips_and_new_metric_reuses_explanations(tiny_llama, tmp_path, toy_metric, shared_data):
    cfg = EvalConfig(datasets=["sst2"], methods=["random"], metrics=["toy"], n=2, out=str(tmp_path / "r.sqlite"))
    first = run(cfg, lm=tiny_llama, progress=False)
    assert (first.computed, first.skipped) == (2, 0)
    again = run(cfg, lm=tiny_llama, progress=False)
    assert (again.computed, again.skipped) == (0, 2)
    query = "SELECT explanation FROM explanations ORDER BY example"
    with sqlite3.connect(tmp_path / "r.sqlite") as conn:
        before = conn.execute(query).fetchall()
    register(Metric("toy2", lambda ctx, routing: [Row("toy_max", 1.0)]))
    try:
        more = run(EvalConfig.from_mapping({"metrics": "toy,toy2"}, cfg), lm=tiny_llama, progress=False)
    finally:
        METRICS.pop("toy2")
    assert more.computed == 2
    with sqlite3.connect(tmp_path / "r.sqlite") as conn:
        assert conn.execute(query).fetchall() == before  # stored explanations reused, not recomputed
        assert conn.execute("SELECT count(*) FROM results").fetchone()[0] == 4
    with pytest.raises(LlmattrError, match="other settings"):
        run(EvalConfig.from_mapping({"seed": 1}, cfg), lm=tiny_llama, progress=False)


def test_resume_after_sigkill_matches_uninterrupted(tiny_folder, tmp_path, reference):
    out = tmp_path / "r.sqlite"
    proc = subprocess.Popen(evaluate_args(tiny_folder, out), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    done = 0
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        done = count_done(out)
        if done >= 1:
            break
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert 1 <= done < 4, "the run was not killed midway"
    with sqlite3.connect(out) as conn:  # nothing half-written: every finished unit has all its rows
        units = conn.execute("SELECT count(*) FROM done").fetchone()[0]
        rows = conn.execute("SELECT count(*) FROM results").fetchone()[0]
        assert rows == units * (2 * 19 + 2)
    subprocess.run(evaluate_args(tiny_folder, out), check=True, capture_output=True)
    assert report_files([out], tmp_path / "report") == reference


def test_two_shards_merged_match_one_process(tiny_folder, tmp_path, reference):
    out = tmp_path / "s.sqlite"
    procs = [subprocess.Popen(evaluate_args(tiny_folder, out, "--shard", f"{i}/2"), stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE) for i in range(2)]
    for proc in procs:
        assert proc.wait() == 0, proc.stderr.read().decode()
    stores = [tmp_path / "s.rank0.sqlite", tmp_path / "s.rank1.sqlite"]
    assert [count_done(store) for store in stores] == [2, 2]  # each: 1 of 2 examples x 2 methods
    assert report_files([tmp_path / "s.rank*.sqlite"], tmp_path / "report") == reference


def test_torchrun_two_processes_merged_match_one_process(tiny_folder, tmp_path, reference):
    """``torchrun --nproc_per_node 2`` (CPU processes, rendezvous on localhost): each process takes its shard from
    RANK/WORLD_SIZE; the merged report is the single process's."""
    out = tmp_path / "t.sqlite"
    launch = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
              "-m", "llmattr", *evaluate_args(tiny_folder, out)[3:]]
    launch[launch.index("--n")] = "--examples"  # torchrun would read --n as an abbreviation of its --nnodes
    threads = {"OMP_NUM_THREADS": str(torch.get_num_threads())}  # torchrun's default of 1 moves float last bits
    done = subprocess.run(launch, capture_output=True, text=True, timeout=600, env={**os.environ, **threads})
    assert done.returncode == 0, done.stderr[-2000:]
    stores = [tmp_path / "t.rank0.sqlite", tmp_path / "t.rank1.sqlite"]
    assert [count_done(store) for store in stores] == [2, 2]
    assert report_files([tmp_path / "t.rank*.sqlite"], tmp_path / "report") == reference


def test_soft_rows_carry_mc_se_and_the_store_records_the_coupling(tiny_llama, tmp_path, shared_data):
    """Coupled (default) and independent runs: the settings name the coupling, Monte-Carlo values carry
    their standard error, deterministic ones (E[R]) none."""
    for coupling in ("coupled", "independent"):
        out = tmp_path / f"{coupling}.sqlite"
        cfg = EvalConfig(datasets=["sst2"], methods=["random"], metrics=["soft"], n=1, samples=3,
                         coupling=coupling, out=str(out))
        assert run(cfg, lm=tiny_llama, progress=False).computed == 1
        with sqlite3.connect(out) as conn:
            assert f'"coupling": "{coupling}"' in conn.execute("SELECT settings FROM settings").fetchone()[0]
            se = dict(conn.execute("SELECT metric, mc_se FROM results"))
        assert se["expected_retained"] is None and se["soft_ns"] >= 0 and se["soft_nc"] >= 0


def test_a_metric_added_to_a_store_computes_only_its_own_units(tiny_llama, tmp_path, shared_data):
    """Issue 51: soft, then comp-suff into the same store without repeating soft's options: comp-suff's units alone
    are computed (the stored explanation reused), the report holds both; the same option with another value is
    refused, naming it; pi-soft records the retain rule its values were computed under."""
    out = tmp_path / "a.sqlite"
    base = dict(datasets=["sst2"], methods=["random"], n=1, out=str(out))
    assert run(EvalConfig(metrics=["soft"], samples=2, **base), lm=tiny_llama, progress=False).computed == 1
    with sqlite3.connect(out) as conn:
        explanation = conn.execute("SELECT explanation FROM explanations").fetchall()
    added = run(EvalConfig(metrics=["comp-suff"], **base), lm=tiny_llama, progress=False)
    assert (added.computed, added.skipped, added.failed) == (1, 0, [])
    with sqlite3.connect(out) as conn:
        assert conn.execute("SELECT explanation FROM explanations").fetchall() == explanation
        assert sorted(conn.execute("SELECT metric FROM done")) == [("comp-suff",), ("soft",)]
    results, _ = build_report([out], tmp_path / "report", ("md",), catalog=catalog())
    assert {"soft_ns", "comprehensiveness"} <= {row[0] for row in results.conn.execute("SELECT metric FROM results")}
    report = (tmp_path / "report" / "report.md").read_text()
    assert "Table 2: original Soft-NC/NS" in report and "- samples = 2" in report and "- removal = " in report
    with pytest.raises(LlmattrError, match=r"other settings \(samples: stored 2 vs 3\)"):
        run(EvalConfig(metrics=["soft"], samples=3, **base), lm=tiny_llama, progress=False)
    assert run(EvalConfig(metrics=["pi-soft"], samples=2, **base), lm=tiny_llama, progress=False).computed == 1
    build_report([out], tmp_path / "r2", ("md",), catalog=catalog())
    assert '- retain_rule = "exact" (pi-Soft' in (tmp_path / "r2" / "report.md").read_text()


def test_ranking_adapters_rows(tiny_llama, monkeypatch):
    """deletion-insertion / comp-suff / log-odds rows match one ranking_metrics call (gold label -> accuracy)."""
    from dataclasses import replace

    from llmattr.api import explain
    from llmattr.faithfulness.ranking import ranking_metrics
    from llmattr.tasks import TASKS, get_task

    task = replace(get_task("sentiment"), name="toy-pn")
    monkeypatch.setitem(TASKS, task.name, task)
    expl = explain("a good film", model=tiny_llama, method="random", task=task)
    expl.example["label"] = "Negative"
    ctx = MetricContext(tiny_llama, expl, EvalConfig().metric_options())
    ref = ranking_metrics(expl, tiny_llama)
    di = METRICS["deletion-insertion"].compute(ctx, "none")
    assert len(di) == 2 * (21 + 2)
    assert {r.metric: r.value for r in di if r.x is None} == {
        "deletion_auc": ref.deletion.auc, "insertion_auc": ref.insertion.auc,
        "deletion_change_auc": ref.deletion.change_auc, "insertion_change_auc": ref.insertion.change_auc}
    cs = METRICS["comp-suff"].compute(ctx, "none")
    acc = [r for r in cs if r.metric == "comprehensiveness_acc"]
    assert [r.value for r in acc] == [float(p == 1) for p in ref.comprehensiveness_pred]
    assert [r.x for r in acc] == list(ref.k_grid) and len(cs) == 4 * 9
    lo = METRICS["log-odds"].compute(ctx, "none")
    assert [r.metric for r in lo] == ["log_odds", "comprehensiveness_top_k", "sufficiency_top_k"]


@pytest.mark.parametrize(("settings", "line"), [
    ({"datasets": ["sst2"], "methods": ["leave-one-out"]}, r"leave-one-out works on sources \(documents\) and sst2's"),
    ({"datasets": ["sst2"], "methods": ["random"], "metrics": ["source-removal"]}, "source-removal works on sources"),
    ({"metrics": ["data-randomization"]}, "data-randomization compares with a model fine-tuned on permuted labels"),
])
def test_work_a_run_cannot_do_is_refused_before_the_model_loads(settings, line, monkeypatch, tmp_path):
    """Issue 51 item 2, issue 49 item 6: the library refuses what the CLI refuses before torch, before loading."""
    import llmattr.evaluation.loop as loop

    monkeypatch.setattr(loop, "load_model", lambda *a, **k: pytest.fail("the model was loaded"))
    with pytest.raises(LlmattrError, match=line):
        run(EvalConfig(n=1, out=str(tmp_path / "r.sqlite"), **settings), progress=False)
    assert not (tmp_path / "r.sqlite").exists()
