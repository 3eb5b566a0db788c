"""The results store: one transaction per unit, settings/version checks, merging shards."""

from __future__ import annotations

import sqlite3

import pytest

from conftest import foreign_sqlite
from llmattr.errors import LlmattrError
from llmattr.store import NONE, SCHEMA, MetricOutput, Results, Row, Store, Unit, expand


def unit(example: str = "ex-1", method: str = "grad-ellm") -> Unit:
    return Unit("tiny", "sst2", example, method, '{"layers":"all"}')


def outputs(value: float = 0.5) -> list[MetricOutput]:
    rows = [Row("pi_soft_ns", value, x=0.05, se=0.01), Row("pi_soft_ns", value + 0.1, x=0.1),
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
    broken = outputs() + outputs()  # the same (metric, routing, x, step) twice: the primary key refuses
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


def test_foreign_sqlite_and_other_files_are_refused_untouched(tmp_path):
    foreign = foreign_sqlite(tmp_path / "app.sqlite")
    text = tmp_path / "notes.sqlite"
    text.write_text("not a database at all\n" * 50)
    for path in (foreign, text):
        before = path.read_bytes()
        with pytest.raises(LlmattrError, match="another program|not an llmattr results store"):
            Store(path)
        assert path.read_bytes() == before  # byte-identical
        assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(path.name)) == [path.name]


def test_second_writer_is_refused_while_the_first_holds_the_store(tmp_path):
    path = tmp_path / "r.sqlite"
    with Store(path) as first:
        first.check_settings("tiny", {"samples": 2})
        with pytest.raises(LlmattrError, match="being written by another llmattr evaluate"):
            Store(path)
    with Store(path) as again:  # released on close (the system releases it on a kill as well)
        assert again.conn.execute("SELECT COUNT(*) FROM settings").fetchone()[0] == 1


def test_clean_close_leaves_everything_in_the_sqlite_file_alone(tmp_path):
    path = tmp_path / "r.sqlite"
    with Store(path) as store:
        store.check_settings("tiny", {"samples": 2, "seed": 0})
        store.write(unit(), '{"x": 1}', 0.25, outputs())
        assert (tmp_path / "r.sqlite-wal").stat().st_size > 0  # the data sits in the log while running
    copy = tmp_path / "copy" / "r.sqlite"
    copy.parent.mkdir()
    copy.write_bytes(path.read_bytes())  # the .sqlite file only, as a user copying it would
    assert len(list(Results([copy]).values("tiny", "pi_soft_ns", "dynamic"))) == 2


SCHEMA_2 = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE settings (model TEXT PRIMARY KEY, settings TEXT NOT NULL);
CREATE TABLE explanations (
    model TEXT NOT NULL, dataset TEXT NOT NULL, example TEXT NOT NULL, method TEXT NOT NULL,
    params TEXT NOT NULL, explanation TEXT NOT NULL, attribution_s REAL NOT NULL,
    PRIMARY KEY (model, dataset, example, method, params));
CREATE TABLE done (
    model TEXT NOT NULL, dataset TEXT NOT NULL, example TEXT NOT NULL, method TEXT NOT NULL,
    params TEXT NOT NULL, metric TEXT NOT NULL, routing TEXT NOT NULL, seconds REAL NOT NULL,
    PRIMARY KEY (model, dataset, example, method, params, metric, routing));
CREATE TABLE results (
    model TEXT NOT NULL, dataset TEXT NOT NULL, example TEXT NOT NULL, method TEXT NOT NULL,
    params TEXT NOT NULL, metric TEXT NOT NULL, routing TEXT NOT NULL, pi REAL NOT NULL,
    step INTEGER NOT NULL, value REAL NOT NULL, mc_se REAL,
    PRIMARY KEY (model, dataset, example, method, params, metric, routing, pi, step)) WITHOUT ROWID;
"""  # the schema the store had before its x column was renamed from pi


def schema_2_store(path, version: str):
    """A store as llmattr wrote it with schema 2: its curve rows' x in a column named ``pi``."""
    with sqlite3.connect(path) as conn:
        conn.executescript(SCHEMA_2)
        conn.executemany("INSERT INTO meta VALUES (?, ?)", [("schema", "2"), ("llmattr_version", version)])
        conn.execute("INSERT INTO settings VALUES ('tiny', '{\"samples\": 2}')")
        conn.execute("INSERT INTO explanations VALUES (?, ?, ?, ?, ?, '{}', 0.5)", unit().as_tuple())
        conn.execute("INSERT INTO done VALUES (?, ?, ?, ?, ?, 'pi-soft', 'dynamic', 1.0)", unit().as_tuple())
        conn.executemany("INSERT INTO results VALUES (?, ?, ?, ?, ?, ?, 'dynamic', ?, -1, ?, NULL)",
                         [(*unit().as_tuple(), "pi_soft_ns", 0.05, 0.5), (*unit().as_tuple(), "pi_soft_ns", 0.1, 0.6)])
    conn.close()


def test_a_schema_2_store_is_read_and_migrated_on_write(tmp_path):
    """Old stores keep reading: a schema 2 store (x column named pi) merges with a new one, and a run of the same
    llmattr version writing to it renames the column in place (schema 4) and resumes."""
    from llmattr.version import __version__

    old, new = tmp_path / "r.rank0.sqlite", tmp_path / "r.rank1.sqlite"
    schema_2_store(old, __version__)
    with Store(new) as store:
        store.check_settings("tiny", {"samples": 2})
        store.write(unit("ex-2"), "{}", 0.1, outputs())
    rows = list(Results([old, new]).values("tiny", "pi_soft_ns", "dynamic"))
    assert [(r[3], r[4], r[6]) for r in rows] == [("ex-1", 0.05, 0.5), ("ex-1", 0.1, 0.6), ("ex-2", 0.05, 0.5),
                                                  ("ex-2", 0.1, 0.6)]
    with sqlite3.connect(old) as conn:  # reading changed nothing
        assert "pi" in [c[1] for c in conn.execute("PRAGMA table_info(results)")]
    conn.close()
    with Store(old) as store:
        assert store.done(unit()) == {("pi-soft", "dynamic")}
        store.write(unit("ex-3"), "{}", 0.1, outputs())
        columns = [c[1] for c in store.conn.execute("PRAGMA table_info(results)")]
        schema = store.conn.execute("SELECT value FROM meta WHERE key = 'schema'").fetchone()[0]
    assert "x" in columns and "pi" not in columns and schema == "4"
    assert len(list(Results([old]).values("tiny", "pi_soft_ns", "dynamic"))) == 4
    other = tmp_path / "other.sqlite"
    schema_2_store(other, "0.0.1")
    with pytest.raises(LlmattrError, match="schema 2, this llmattr reads schema 4"):
        Store(other)  # another version's old store is read, never written
    assert len(list(Results([other]).values("tiny", "pi_soft_ns", "dynamic"))) == 2


IXG = "input-x-gradient"
OLD_PARAMS, NEW_PARAMS = '{"reduction":"sum","target":"logit"}', '{"objective":"logit","reduction":"sum"}'


def schema_3_store(path, version: str, value: float = 0.5):
    """A store as llmattr wrote it with schema 3: the tables of today, the objective recorded in the method
    parameters under its earlier name ``target``."""
    old = Unit("tiny", "sst2", "ex-1", IXG, OLD_PARAMS)
    with sqlite3.connect(path) as conn:
        conn.executescript(SCHEMA)
        conn.executemany("INSERT INTO meta VALUES (?, ?)", [("schema", "3"), ("llmattr_version", version)])
        conn.execute("INSERT INTO settings VALUES ('tiny', '{\"samples\": 2}')")
        conn.execute("INSERT INTO explanations VALUES (?, ?, ?, ?, ?, '{}', 0.5)", old.as_tuple())
        conn.execute("INSERT INTO done VALUES (?, ?, ?, ?, ?, 'pi-soft', 'dynamic', 1.0)", old.as_tuple())
        conn.executemany("INSERT INTO results VALUES (?, ?, ?, ?, ?, ?, 'dynamic', ?, -1, ?, NULL)",
                         [(*old.as_tuple(), "pi_soft_ns", 0.05, value), (*old.as_tuple(), "pi_soft_ns", 0.1, 0.6)])
    conn.close()


def test_a_schema_3_store_reads_target_as_objective_and_resumes(tmp_path):
    """Old stores keep reading after the method parameter ``target`` was renamed ``objective`` (issue 22): a
    schema 3 store's params key reads as the new one (values, explanations, labels, merging with a new shard of
    the same run), reading changes nothing, and a run of the same version writing to it renames the key in place
    (schema 4) so that ``input-x-gradient:objective=logit`` (or ``:target=logit``) finds its units done."""
    from llmattr.evaluation.method_specs import parse_method
    from llmattr.version import __version__

    spec = parse_method(f"{IXG}:target=logit")
    assert spec.key == parse_method(f"{IXG}:objective=logit").key == NEW_PARAMS
    old, new = tmp_path / "r.rank0.sqlite", tmp_path / "r.rank1.sqlite"
    schema_3_store(old, __version__)
    renamed = Unit("tiny", "sst2", "ex-1", IXG, spec.key)
    with Store(new) as store:
        store.check_settings("tiny", {"samples": 2})
        store.write(renamed, "{}", 0.5, outputs())  # the same unit, as a shard of the same run wrote it
        store.write(Unit("tiny", "sst2", "ex-2", IXG, NEW_PARAMS), "{}", 0.1, outputs())
    results = Results([old, new], method_defaults={IXG: {"objective": "probability", "reduction": "sum"}})
    rows = list(results.values("tiny", "pi_soft_ns", "dynamic"))
    assert {r[2] for r in rows} == {NEW_PARAMS} and len(rows) == 4
    assert [r[2] for r in results.explanations("tiny")] == [NEW_PARAMS, NEW_PARAMS]
    assert results.label(IXG, NEW_PARAMS) == results.label(IXG, OLD_PARAMS) == f"{IXG}:objective=logit"
    clashing = tmp_path / "clash.sqlite"
    schema_3_store(clashing, __version__, value=0.9)
    with pytest.raises(LlmattrError, match="disagrees with another store"):
        Results([new, clashing])  # compared under the new key: the old key's other value is found
    with sqlite3.connect(old) as conn:  # reading changed nothing
        assert {r[0] for r in conn.execute("SELECT params FROM results")} == {OLD_PARAMS}
    conn.close()
    with Store(old) as store:
        assert store.done(renamed) == {("pi-soft", "dynamic")} and store.explanation(renamed) == ("{}", 0.5)
        keys = {r[0] for table in ("explanations", "done", "results")
                for r in store.conn.execute(f"SELECT params FROM {table}")}
        schema = store.conn.execute("SELECT value FROM meta WHERE key = 'schema'").fetchone()[0]
    assert keys == {NEW_PARAMS} and schema == "4"
    assert len(list(Results([old]).values("tiny", "pi_soft_ns", "dynamic"))) == 2
    other = tmp_path / "other.sqlite"
    schema_3_store(other, "0.0.1")
    with pytest.raises(LlmattrError, match="schema 3, this llmattr reads schema 4"):
        Store(other)  # another version's old store is read, never written
    assert {r[2] for r in Results([other]).values("tiny", "pi_soft_ns", "dynamic")} == {NEW_PARAMS}


def test_row_takes_the_old_spelling_pi():
    assert Row("m", 0.5, pi=0.25) == Row("m", 0.5, x=0.25) and Row("m", 0.5, pi=0.25).x == 0.25
    with pytest.raises(LlmattrError, match="not both"):
        Row("m", 0.5, x=0.1, pi=0.2)


def test_a_store_whose_model_card_names_the_loss_objective_reads_merges_and_resumes(tmp_path):
    """A fine-tuned model's card facts are stored with the settings; a store written before finetune's
    ``objective`` was named ``loss`` (issue 39) reads it as ``loss``, merges with a new shard and resumes, and the
    report's card note is that of a new store."""
    from llmattr.report.layouts import card_notes

    facts = {"task": "sst2", "base_model": "tiny", "seed": 0, "n_train": 4, "data": {"source": "toy.jsonl"}}
    old, new = tmp_path / "r.rank0.sqlite", tmp_path / "r.rank1.sqlite"
    with Store(old) as store:
        store.check_settings("tiny", {"samples": 2, "model_card": {**facts, "objective": "label"}})
        store.write(unit(), "{}", 0.1, outputs())
    settings = {"samples": 2, "model_card": {**facts, "loss": "label"}}
    with Store(old) as store:
        store.check_settings("tiny", settings)  # an evaluate of today resumes the old store
    with Store(new) as store:
        store.check_settings("tiny", settings)
        store.write(unit("ex-2"), "{}", 0.1, outputs())
    results = Results([old, new])
    assert results.settings("tiny") == settings
    note = card_notes(results.settings("tiny")["model_card"])[0]
    assert "(label loss, seed 0) on 4 training rows of toy.jsonl" in note
