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
        store.write(unit(), "{}", 0.1, outputs())
        store.check_settings("other-model", {"samples": 3, "seed": 0})  # settings are per model
        with pytest.raises(LlmattrError, match=r"\(samples: stored 15 vs 30\); rerun with the stored settings or "
                                               r"write to another --out file$"):
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
    llmattr version writing to it renames the column in place (schema 5) and resumes."""
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
    assert "x" in columns and "pi" not in columns and schema == "5"
    assert len(list(Results([old]).values("tiny", "pi_soft_ns", "dynamic"))) == 4
    other = tmp_path / "other.sqlite"
    schema_2_store(other, "0.0.1")
    with pytest.raises(LlmattrError, match="schema 2, this llmattr reads schema 5"):
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
    (schema 5) so that ``input-x-gradient:objective=logit`` (or ``:target=logit``) finds its units done."""
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
    assert keys == {NEW_PARAMS} and schema == "5"
    assert len(list(Results([old]).values("tiny", "pi_soft_ns", "dynamic"))) == 2
    other = tmp_path / "other.sqlite"
    schema_3_store(other, "0.0.1")
    with pytest.raises(LlmattrError, match="schema 3, this llmattr reads schema 5"):
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


def test_a_store_grows_by_the_settings_of_new_metrics(tmp_path):
    """A metric added later brings its own options: only a setting both runs give with two values refuses."""
    with Store(tmp_path / "r.sqlite") as store:
        store.check_settings("tiny", {"seed": 0, "samples": 2, "coupling": "coupled"})
        store.write(unit(), "{}", 0.1, outputs())
        store.check_settings("tiny", {"seed": 0, "removal": "zero"})  # comp-suff after pi-soft: grows
        assert store.settings("tiny") == {"seed": 0, "samples": 2, "coupling": "coupled", "removal": "zero"}
        store.check_settings("tiny", {"seed": 0, "samples": 2})  # pi-soft again, the same options
        with pytest.raises(LlmattrError, match=r"\(removal: stored 'zero' vs 'mask'\)"):
            store.check_settings("tiny", {"seed": 0, "removal": "mask"})
        with pytest.raises(LlmattrError, match=r"\(seed: stored 0 vs 1\)"):
            store.check_settings("tiny", {"seed": 1})
        assert store.settings("tiny")["removal"] == "zero"  # a refused run records nothing


def test_a_store_holding_nothing_takes_the_next_settings(tmp_path):
    """A run whose every unit failed (or that stopped before its first unit) stores no value: its settings do not
    bind the next run."""
    with Store(tmp_path / "r.sqlite") as store:
        store.check_settings("tiny", {"seed": 0, "samples": 2})
        store.fail(unit(), "boom")
        store.check_settings("tiny", {"seed": 3, "samples": 5})
        assert store.settings("tiny") == {"seed": 3, "samples": 5}


def test_reports_merge_stores_of_different_metrics_but_not_conflicts(tmp_path):
    a, b, c = (tmp_path / f"{name}.sqlite" for name in "abc")
    for path, settings in ((a, {"seed": 0, "samples": 2}), (b, {"seed": 0, "removal": "zero"}),
                           (c, {"seed": 0, "removal": "mask"})):
        with Store(path) as store:
            store.check_settings("tiny", settings)
            store.write(unit(path.stem), "{}", 0.1, outputs())
    assert Results([a, b]).settings("tiny") == {"seed": 0, "samples": 2, "removal": "zero"}
    with pytest.raises(LlmattrError, match=r"other settings for tiny .*\(removal: stored 'zero' vs 'mask'\)"):
        Results([a, b, c])


def legacy_store(path, schema: str, metric: str = "pi-soft", settings: str = '{"samples": 2, "seed": 0}'):
    """A store as llmattr wrote it before it recorded the retain rule (schema <= 4)."""
    with Store(path) as store:
        store.conn.execute("INSERT INTO settings VALUES ('tiny', ?)", (settings,))
        store.write(unit(), "{}", 0.1, [MetricOutput(metric, "dynamic", 1.0, [Row("x", 0.5)])])
        store.conn.execute("UPDATE meta SET value = ? WHERE key = 'schema'", (schema,))
        store.conn.commit()


@pytest.mark.parametrize("schema", ["3", "4"])
def test_old_stores_are_labelled_with_the_clip_rule_and_never_mixed(tmp_path, schema):
    old, new = tmp_path / "old.sqlite", tmp_path / "new.sqlite"
    legacy_store(old, schema)
    assert Results([old]).settings("tiny") == {"samples": 2, "seed": 0, "retain_rule": "clip"}
    with Store(new) as store:
        store.check_settings("tiny", {"samples": 2, "seed": 0, "retain_rule": "exact"})
        store.write(unit("ex-2"), "{}", 0.1, outputs())
    with pytest.raises(LlmattrError, match=r"old.sqlite has other settings for tiny than the stores before it "
                                           r"\(retain_rule: stored 'exact' vs 'clip'\); report them separately"):
        Results([old, new])  # merged in the order of their names
    with Store(old) as store:  # written again: brought to the current schema, the rule recorded
        assert store.conn.execute("SELECT value FROM meta WHERE key = 'schema'").fetchone()[0] == "5"
        assert store.settings("tiny")["retain_rule"] == "clip"
        with pytest.raises(LlmattrError, match=r"\(retain_rule: stored 'clip' vs 'exact'\); its values were "
                                               r"computed under another rule of the code \(retain_rule 'clip': "
                                               r"pi-Soft's alpha search on s clipped .*\): write to another --out"):
            store.check_settings("tiny", {"samples": 2, "seed": 0, "retain_rule": "exact"})
        store.check_settings("tiny", {"seed": 0, "removal": "zero"})  # a metric without the rule: it grows


def test_old_stores_without_a_searched_metric_record_no_rule(tmp_path):
    legacy_store(tmp_path / "old.sqlite", "4", metric="comp-suff", settings='{"removal": "zero", "seed": 0}')
    assert Results([tmp_path / "old.sqlite"]).settings("tiny") == {"removal": "zero", "seed": 0}


def test_a_missing_store_beside_its_shards_names_them(tmp_path):
    """Issue 51 item 5: ``status s.sqlite`` after a sharded run names the shards and the glob that reads them."""
    for rank in range(2):
        with Store(tmp_path / f"s.rank{rank}.sqlite"):
            pass
    with pytest.raises(LlmattrError, match=r"store not found: .*s\.sqlite \(a sharded run wrote s\.rank0\.sqlite, "
                                           r"s\.rank1\.sqlite: give '.*s\.rank\*\.sqlite'\)$"):
        expand([tmp_path / "s.sqlite"])
    with pytest.raises(LlmattrError, match=r"store not found: .*other\.sqlite$"):
        expand([tmp_path / "other.sqlite"])
