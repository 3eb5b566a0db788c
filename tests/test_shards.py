"""Balanced shards: which examples each shard of ``llmattr evaluate`` takes, and that the rule is recorded so a shard
resumes its own examples (a store written before balancing resumes with ``i::n``)."""

from __future__ import annotations

import json
import sqlite3

import pytest
import torch

from conftest import build_tiny
from llmattr.evaluation import EvalConfig, load_dataset, run
from llmattr.evaluation.sharding import (
    BALANCED,
    STRIDED,
    balanced_owners,
    example_cost,
    shard_device,
    shard_examples,
)
from llmattr.faithfulness import METRICS, Metric, register
from llmattr.store import Results, Row


@pytest.fixture(scope="module")
def mix(shared_data):
    """50 SST-2 and 50 IMDb examples (the default sample of each): short sentences beside long reviews."""
    return [load_dataset("sst2", 50, 0), load_dataset("imdb", 50, 0)]


@pytest.fixture(scope="module")
def tiny_long(tiny_tokenizer):
    """A tiny random Llama with room for an IMDb review."""
    return build_tiny("llama", tiny_tokenizer, max_position_embeddings=2048)


@pytest.fixture
def toy_metric():
    """A cheap deterministic metric (mean score), registered for one test."""
    yield register(Metric("toy", lambda ctx, routing: [Row("toy_mean", float(ctx.explanation.score_matrix().mean()))]))
    METRICS.pop("toy")


def keys(data) -> list[tuple[str, str]]:
    return [(ds.name, str(ex["id"])) for ds in data for ex in ds.examples]


def imbalance(data, world: int, rule: str) -> float:
    """The heaviest shard's estimated cost over the mean shard's."""
    loads = [sum(example_cost(ds.task, ex) for ds in shard_examples(data, rank, world, rule) for ex in ds.examples)
             for rank in range(world)]
    return max(loads) / (sum(loads) / world)


@pytest.mark.parametrize("world", [1, 2, 3, 4, 5])
def test_every_example_in_exactly_one_shard_in_its_order(mix, world):
    shards = [keys(shard_examples(mix, rank, world)) for rank in range(world)]
    taken = [key for shard in shards for key in shard]
    assert sorted(taken) == sorted(keys(mix)) and len(set(taken)) == len(taken)
    order = {key: place for place, key in enumerate(keys(mix))}
    assert all(shard == sorted(shard, key=order.get) for shard in shards)  # each shard keeps the datasets' order


def test_assignment_is_deterministic_whatever_the_order_of_the_datasets(mix):
    assert balanced_owners(mix, 4) == balanced_owners(mix, 4) == balanced_owners(mix[::-1], 4)


@pytest.mark.parametrize("world", [2, 3, 4, 5])
def test_balanced_on_a_skewed_mix(mix, world):
    """IMDb reviews are ~30x longer than SST-2 sentences: ``i::n`` leaves a shard up to 26% over the mean, the
    balanced rule within 1%."""
    assert imbalance(mix, world, BALANCED) <= 1.15
    assert imbalance(mix, world, BALANCED) <= imbalance(mix, world, STRIDED)
    assert imbalance(mix, 5, STRIDED) > 1.15  # the skew the rule is there for


def stored_examples(path) -> list[tuple[str, str]]:
    with sqlite3.connect(path) as conn:
        return sorted(conn.execute("SELECT DISTINCT dataset, example FROM explanations"))


def test_a_store_without_a_rule_resumes_with_i_n(tiny_long, tmp_path, toy_metric, shared_data):
    """A store written before balancing records no rule: it resumes with ``i::n``, as it was written (and a new
    store records ``balanced``)."""
    cfg = EvalConfig(datasets=["sst2", "imdb"], methods=["random"], metrics=["toy"], n=4, shard="0/2",
                     out=str(tmp_path / "r.sqlite"))
    data = [load_dataset("sst2", 4, 0), load_dataset("imdb", 4, 0)]
    strided, balanced = (sorted(keys(shard_examples(data, 0, 2, rule))) for rule in (STRIDED, BALANCED))
    assert strided != balanced
    store = tmp_path / "r.rank0.sqlite"
    assert run(cfg, lm=tiny_long, progress=False).computed == len(balanced)
    assert stored_examples(store) == balanced
    with sqlite3.connect(store) as conn:  # make it a store of the old rule, midway: settings, one unit done
        settings = json.loads(conn.execute("SELECT settings FROM settings").fetchone()[0])
        assert settings.pop("shards") == BALANCED
        conn.execute("UPDATE settings SET settings = ?", (json.dumps(settings, sort_keys=True),))
        first = sorted(set(strided) & set(balanced))[0]  # done by both rules: the resumed run skips it
        for table in ("explanations", "done", "results"):
            conn.execute(f"DELETE FROM {table} WHERE NOT (dataset = ? AND example = ?)", first)
    resumed = run(cfg, lm=tiny_long, progress=False)
    assert (resumed.computed, resumed.skipped) == (len(strided) - 1, 1)
    assert stored_examples(store) == strided
    with sqlite3.connect(store) as conn:
        assert "shards" not in json.loads(conn.execute("SELECT settings FROM settings").fetchone()[0])


def rows(paths) -> list[tuple]:
    results = Results(paths)
    return list(results.conn.execute("SELECT * FROM results ORDER BY dataset, example, method, params, metric, x"))


def test_three_shards_merged_equal_one_process(tiny_long, tmp_path, toy_metric, shared_data):
    common = dict(datasets=["sst2", "imdb"], methods=["random", "grad-ellm"], metrics=["toy"], n=4)
    run(EvalConfig(out=str(tmp_path / "one.sqlite"), **common), lm=tiny_long, progress=False)
    for rank in range(3):
        run(EvalConfig(out=str(tmp_path / "s.sqlite"), shard=f"{rank}/3", **common), lm=tiny_long, progress=False)
    shards = sorted(tmp_path.glob("s.rank*.sqlite"))
    assert len(shards) == 3 and all(stored_examples(path) for path in shards)
    assert rows(shards) == rows([tmp_path / "one.sqlite"])


@pytest.mark.parametrize(("env", "gpus", "expected"), [
    ({"LOCAL_RANK": "3"}, 4, "cuda:3"),  # torchrun / accelerate
    ({"SLURM_LOCALID": "2"}, 4, "cuda:2"),  # srun tasks sharing the node's GPUs
    ({"SLURM_LOCALID": "2"}, 1, "cuda:0"),  # a task Slurm bound to one GPU sees only it
    ({"LOCAL_RANK": "1", "SLURM_LOCALID": "0"}, 2, "cuda:1"),  # the launcher's own rank first
    ({}, 4, "auto"),  # one process: auto stays auto
])
def test_each_local_process_takes_its_own_gpu(monkeypatch, env, gpus, expected):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)
    assert shard_device("auto", env) == expected
    assert shard_device("cpu", env) == "cpu"  # an explicit device is kept


def test_no_gpu_keeps_the_device_whatever_the_rank(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert shard_device("auto", {"SLURM_LOCALID": "1"}) == "auto"
