"""``llmattr evaluate --launcher``: shards as one submitit job array; a preempted shard requeued resumes from its
store, and the merged report is the one-process run's."""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from llmattr.cli import app
from llmattr.errors import LlmattrError
from llmattr.evaluation import EvalConfig, run
from llmattr.evaluation.launch import Resources, executor, store_pattern, submit
from test_runner import count_done, report_files, tiny_folder  # noqa: F401 - tiny_folder is a fixture

SHARDS = 4


def config(folder: Path, out: Path) -> EvalConfig:
    """8 SST-2 examples x 2 methods: 4 units per shard of 4."""
    return EvalConfig(model=str(folder), datasets=["sst2"], methods=["grad-ellm", "random"], metrics=["pi-soft"],
                      n=8, samples=2, device="cpu", out=str(out))


def task_pid(controller: int, deadline: float) -> int:
    """The pid of the task process the local job's controller started (its one child)."""
    children = Path(f"/proc/{controller}/task/{controller}/children")
    while time.monotonic() < deadline:
        pids = children.read_text().split()
        if pids:
            return int(pids[0])
        time.sleep(0.02)
    raise AssertionError("the shard's task never started")


def test_four_shards_one_preempted_and_requeued_match_one_process(tiny_folder, tmp_path, shared_data):  # noqa: F811
    ref = tmp_path / "ref"
    ref.mkdir()
    assert run(config(tiny_folder, ref / "r.sqlite"), progress=False).computed == 16
    reference = report_files([ref / "r.sqlite"], ref / "report")

    cfg = config(tiny_folder, tmp_path / "s.sqlite")
    jobs = submit(cfg, SHARDS, "local", tmp_path / "submitit")
    store = tmp_path / "s.rank0.sqlite"
    deadline = time.monotonic() + 300
    task = task_pid(int(jobs[0].job_id), deadline)
    while time.monotonic() < deadline and count_done(store) < 1:
        time.sleep(0.02)
    os.kill(task, signal.SIGUSR2)  # what Slurm sends before preempting or timing out a job
    while Path(f"/proc/{task}").exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    killed_at = count_done(store)
    assert 1 <= killed_at < 4, "the shard was not killed midway"
    summaries = [job.result() for job in jobs]
    assert "Requeued job" in jobs[0].stdout() + jobs[0].stderr()
    assert summaries[0].skipped == killed_at and summaries[0].computed == 4 - killed_at
    assert [count_done(tmp_path / f"s.rank{i}.sqlite") for i in range(SHARDS)] == [4] * SHARDS
    assert report_files([Path(store_pattern(cfg, SHARDS))], tmp_path / "report") == reference


def evaluate(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "llmattr", "evaluate", *args], capture_output=True, text=True)


@pytest.mark.parametrize(("args", "message"), [
    (["--shards", "2"], "need --launcher local or slurm"),
    (["--launcher", "cloud", "--shards", "2"], "unknown launcher 'cloud'; valid: none, local, slurm"),
    (["--launcher", "local"], "--launcher local needs --shards n"),
    (["--launcher", "local", "--shards", "2", "--partition", "gpu"], "--partition: Slurm options"),
    (["--launcher", "slurm", "--shards", "0"], "--shards must be at least 1, got 0"),
    (["--launcher", "local", "--shards", "2", "--shard", "0/2"], "--shard 0/2 runs one shard yourself"),
    (["--launcher", "slurm", "--shards", "2", "--time", "0"], "--time must be at least 1 minute"),
    (["--launcher", "slurm", "--shards", "2"], "srun is not on this machine's PATH"),
])
def test_bad_launcher_options_refused_in_one_line(args, message, tmp_path):
    done = evaluate(*args, "--out", str(tmp_path / "r.sqlite"))
    assert done.returncode == 2 and message in done.stderr, done.stderr
    assert not (tmp_path / "submitit").exists()


def test_slurm_jobs_ask_for_the_resources(tmp_path, monkeypatch):
    """The sbatch script of a shard's job names the partition, GPUs, time, memory and account, and the USR2 signal
    before the time limit that makes the job requeue itself."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text("#!/bin/sh\n")
    (bin_dir / "srun").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    made = executor("slurm", tmp_path / "submitit", Resources(partition="gpu", gpus=1, minutes=240, mem_gb=64,
                                                              account="myproj"))
    script = made._executor._make_submission_file_text("llmattr", "uid")
    for line in ("--partition=gpu", "--gpus-per-node=1", "--time=240", "--mem=64GB", "--account=myproj",
                 "--signal=USR2@"):
        assert line in script


def test_without_submitit_the_launcher_names_the_extra(tmp_path, monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "submitit" else real(name, *a))
    result = CliRunner().invoke(app, ["evaluate", "--launcher", "slurm", "--shards", "2", "--out",
                                      str(tmp_path / "r.sqlite")])
    assert isinstance(result.exception, LlmattrError)
    assert str(result.exception) == "--launcher slurm submits through submitit: pip install 'llmattr[slurm]'"
