"""The results store: one transaction per unit, settings/version checks, merging shards."""

from __future__ import annotations

import sqlite3

import pytest

from llmattr.errors import LlmattrError
from llmattr.store import NONE, MetricOutput, Results, Row, Store, Unit, expand


def unit(example: str = "ex-1", method: str = "grad-ellm") -> Unit:
    return Unit("tiny", "sst2", example, method, '{"layers":"all"}')


def outputs(value: float = 0.5) -> list[MetricOutput]:
    rows = [Row("pi_soft_ns", value, pi=0.05, se=0.01), Row("pi_soft_ns", value + 0.1, pi=0.1),
            Row("pi_soft_ns_auc", value)]
    return [MetricOutput("pi-soft", "dynamic", 1.5, rows)]


def test_write_read_and_done(tmp_path):
    path = tmp_path / "r.sqlite"
    with Store(path) as store:
        store.check_settings("tiny", {"samples": 2, "seed": 0})
        assert store.done(unit()) == set()
        store.write(unit(), '{"x": 1}', 0.25, outputs())
        assert store.done(unit()) == {("pi-soft", "dynamic")}
        assert store.explanation(unit()) == ('{"x": 1}', 0.25)
        assert store.conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    results = Results([path])
    rows = list(results.values("tiny", "pi_soft_ns", "dynamic"))
    assert rows == [("sst2", "grad-ellm", '{"layers":"all"}', "ex-1", 0.05, NONE, 0.5, 0.01),
                    ("sst2", "grad-ellm", '{"layers":"all"}', "ex-1", 0.1, NONE, 0.6, None)]
    assert results.settings("tiny") == {"samples": 2, "seed": 0}
    assert results.models() == ["tiny"]


def test_unit_is_one_transaction(tmp_path):
    """A failure while writing a unit leaves none of its rows (as a SIGKILL mid-write would)."""
    store = Store(tmp_path / "r.sqlite")
    broken = outputs() + outputs()  # the same (metric, routing, pi, step) twice: the primary key refuses
    with pytest.raises(sqlite3.IntegrityError):
        store.write(unit(), "{}", 0.1, broken)
    assert store.conn.execute("SELECT count(*) FROM results").fetchone()[0] == 0
    assert store.conn.execute("SELECT count(*) FROM explanations").fetchone()[0] == 0
    assert store.done(unit()) == set()


def test_refuses_other_settings_version_and_files(tmp_path):
    path = tmp_path / "r.sqlite"
    with Store(path) as store:
        store.check_settings("tiny", {"samples": 15, "seed": 0})
        store.check_settings("other-model", {"samples": 3, "seed": 0})  # settings are per model
        with pytest.raises(LlmattrError, match=r"samples: stored 15 vs 30.*another --out"):
            store.check_settings("tiny", {"samples": 30, "seed": 0})
        store.conn.execute("UPDATE meta SET value = '0.0.1' WHERE key = 'llmattr_version'")
        store.conn.commit()
    with pytest.raises(LlmattrError, match="written by llmattr 0.0.1"):
        Store(path)
    junk = tmp_path / "junk.sqlite"
    junk.write_text("not a database" * 100)
    with pytest.raises(LlmattrError, match="not an llmattr results store"):
        Store(junk)


def test_merge_shards_dedup_and_conflicts(tmp_path):
    a, b, c = (tmp_path / f"r.rank{i}.sqlite" for i in range(3))
    for path, example in ((a, "ex-1"), (b, "ex-2")):
        with Store(path) as store:
            store.check_settings("tiny", {"samples": 2})
            store.write(unit(example), "{}", 0.1, outputs())
    with Store(b) as store:  # a unit present in two shards with equal values is kept once
        store.write(unit("ex-1"), "{}", 0.1, outputs())
    merged = Results([str(tmp_path / "r.rank*.sqlite")])
    assert merged.paths == [a, b]
    examples = {row[3] for row in merged.values("tiny", "pi_soft_ns_auc", "dynamic")}
    assert examples == {"ex-1", "ex-2"}
    assert len(list(merged.values("tiny", "pi_soft_ns", "dynamic"))) == 4
    with Store(c) as store:
        store.check_settings("tiny", {"samples": 2})
        store.write(unit("ex-1"), "{}", 0.1, outputs(value=0.9))
    with pytest.raises(LlmattrError, match="disagrees"):
        Results([a, c])
    d = tmp_path / "d.sqlite"
    with Store(d) as store:
        store.check_settings("tiny", {"samples": 7})
    with pytest.raises(LlmattrError, match="other settings"):
        Results([a, d])


def test_expand_errors(tmp_path):
    with pytest.raises(LlmattrError, match="no store matches"):
        expand([str(tmp_path / "*.sqlite")])
    with pytest.raises(LlmattrError, match="store not found"):
        expand([tmp_path / "missing.sqlite"])
