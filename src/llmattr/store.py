"""The results store of ``llmattr evaluate``: one SQLite file (stdlib sqlite3, WAL mode) per process.

Tables (docs/evaluate.md):

- ``meta``: store schema version and the llmattr version that created the file.
- ``settings``: per model, the run settings that change metric values (samples, seed, metric options), the rules of
  the code the metrics' values depend on (:data:`~llmattr.declarations.RULES`: pi-Soft's ``retain_rule``) and the
  facts of a fine-tuned model's card, read under their current names (:func:`current_settings`). A store grows: a
  run adds the settings of its metrics to those stored (:meth:`Store.check_settings`), and is refused, never mixed,
  only where a setting both give has two values (the same metric option, the seed, a rule).
- ``explanations``: one Explanation JSON and its attribution time per (model, dataset, example, method,
  params).
- ``done``: one row per finished (model, dataset, example, method, params, metric, routing) with the
  metric's wall time; what a rerun skips.
- ``planned``: the latest run's plan per (model, dataset, method, params): its shard's number of examples and the
  (metric, routing) pairs each needs (JSON); ``failed``: the error of each unit the latest run could not evaluate
  (removed when the unit is written). Both are read by ``llmattr status`` only.
- ``results``: one value per (model, dataset, example, method, params, metric, routing, x, step).
  ``x`` is the x-axis of a curve (the soft metrics' pi, the ranking metrics' fraction of tokens or K, the
  per-layer metrics' layer) and ``step`` the generation step; ``-1`` in either means "scalar" / "averaged over
  steps". Stores of an older schema (:data:`LEGACY`: 2, whose ``x`` column was named ``pi``; 2 and 3, whose
  method ``params`` name the objective ``target``) are read as if they were new (the params through
  :func:`~llmattr.declarations.current_params`) and changed in place when a run of the same version writes to them
  again; a store of schema <= 4 recorded no retain rule, so where it holds values of a metric that searched pi-Soft's
  alpha then (:data:`~llmattr.declarations.CLIPPED_METRICS`) its settings read ``retain_rule = "clip"``.
  ``mc_se`` is the value's Monte-Carlo standard error over samples (NULL for deterministic metrics).

Every finished (example, method) is written in one transaction, so a process killed at any moment
(even SIGKILL) leaves either all of that unit's rows or none of them.

While a run writes, recent transactions sit in the ``-wal`` file beside the store; a clean exit (also
Ctrl-C) checkpoints them into the ``.sqlite`` file, which then holds everything alone. After a kill
(SIGKILL, power loss) keep the ``-wal`` file with the store (or rerun the command, which resumes and
checkpoints) before copying the ``.sqlite`` file on its own.

One process writes a store at a time: a second ``llmattr evaluate`` on the same ``--out`` is refused
(an exclusive lock on the file, released by the system when the first process ends, even if killed).
A SQLite file that is not an llmattr store is refused without being changed.
"""

from __future__ import annotations

import glob
import json
import sqlite3

try:
    import fcntl  # POSIX advisory locks; Windows has none, there concurrent writers are not detected
except ImportError:
    fcntl = None
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import InitVar, dataclass, field
from pathlib import Path

from .declarations import (
    CLIPPED_METRICS,
    RENAMED_PARAMS,
    RETAIN_RULE,
    RULE_VERSIONS,
    RULES,
    current_card,
    current_params,
    method_label,
)
from .errors import LlmattrError
from .version import __version__

DEFAULT_ORDER = 100  # a dataset's place in the report when its task gives none (``Task.report_order``)
SCHEMA_VERSION = 5  # 2: results.mc_se; 3: results.pi renamed x (every metric's x axis); 4: params' target: objective;
# 5: settings record the rules of the code (retain_rule)
LEGACY = {"2": "pi", "3": "x", "4": "x"}  # an older schema still read -> the name its x column had
NONE = -1  # sentinel for "no x" / "no step" (primary-key columns cannot hold NULL duplicates)
KEY = ("model", "dataset", "example", "method", "params")

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS settings (model TEXT PRIMARY KEY, settings TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS explanations (
    model TEXT NOT NULL, dataset TEXT NOT NULL, example TEXT NOT NULL, method TEXT NOT NULL,
    params TEXT NOT NULL, explanation TEXT NOT NULL, attribution_s REAL NOT NULL,
    PRIMARY KEY (model, dataset, example, method, params));
CREATE TABLE IF NOT EXISTS done (
    model TEXT NOT NULL, dataset TEXT NOT NULL, example TEXT NOT NULL, method TEXT NOT NULL,
    params TEXT NOT NULL, metric TEXT NOT NULL, routing TEXT NOT NULL, seconds REAL NOT NULL,
    PRIMARY KEY (model, dataset, example, method, params, metric, routing));
CREATE TABLE IF NOT EXISTS results (
    model TEXT NOT NULL, dataset TEXT NOT NULL, example TEXT NOT NULL, method TEXT NOT NULL,
    params TEXT NOT NULL, metric TEXT NOT NULL, routing TEXT NOT NULL, x REAL NOT NULL,
    step INTEGER NOT NULL, value REAL NOT NULL, mc_se REAL,
    PRIMARY KEY (model, dataset, example, method, params, metric, routing, x, step)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS planned (
    model TEXT NOT NULL, dataset TEXT NOT NULL, method TEXT NOT NULL, params TEXT NOT NULL,
    examples INTEGER NOT NULL, wanted TEXT NOT NULL, PRIMARY KEY (model, dataset, method, params));
CREATE TABLE IF NOT EXISTS failed (
    model TEXT NOT NULL, dataset TEXT NOT NULL, example TEXT NOT NULL, method TEXT NOT NULL,
    params TEXT NOT NULL, error TEXT NOT NULL, PRIMARY KEY (model, dataset, example, method, params));
"""
RESULT_KEY = ("model", "dataset", "example", "method", "params", "metric", "routing", "x", "step")


def canonical(params: dict) -> str:
    """Method parameters as a canonical JSON string (sorted keys), the ``params`` key column."""
    return json.dumps(params, sort_keys=True, separators=(",", ":"))


def current_key(params: str) -> str:
    """A legacy store's ``params`` key with its parameters under their current names (``{"target":"logit"}`` ->
    ``{"objective":"logit"}``); a key without an old name is returned as it is."""
    if not any(f'"{old}"' in params for old in RENAMED_PARAMS):
        return params
    return canonical(current_params(json.loads(params), "stored method parameters"))


def current_settings(text: str) -> dict:
    """A model's stored settings (JSON), the facts of its model card under their current names (a store written
    before a card fact was renamed reads, merges and resumes the same: :func:`~llmattr.declarations.current_card`)."""
    settings = json.loads(text)
    if "model_card" in settings:
        settings["model_card"] = current_card(settings["model_card"])
    return settings


def clip_rule(settings: dict, metrics: Iterable[str]) -> dict:
    """The settings of a model in a store of schema <= 4, which recorded no retain rule: where the store holds values
    of a metric that searched pi-Soft's alpha then (``metrics``: its stored metric names), they were computed on
    scores clipped to [1e-6, 1 - 1e-6], so its settings say ``retain_rule = "clip"``."""
    if RETAIN_RULE in settings or not set(metrics) & set(CLIPPED_METRICS):
        return settings
    return {**settings, RETAIN_RULE: "clip"}


def legacy_settings(conn: sqlite3.Connection) -> dict[str, dict]:
    """Every model's settings in a store of schema <= 4 (:func:`current_settings`, :func:`clip_rule`)."""
    return {model: clip_rule(current_settings(text), (row[0] for row in conn.execute(
        "SELECT DISTINCT metric FROM done WHERE model = ?", (model,))))
        for model, text in conn.execute("SELECT model, settings FROM settings").fetchall()}


def _current_keys(conn: sqlite3.Connection) -> None:
    """Give ``conn`` the SQL function ``current_key(params)`` (:func:`current_key`)."""
    conn.create_function("current_key", 1, current_key, deterministic=True)


@dataclass(frozen=True)
class Row:
    """One metric value: ``x`` is the curve's x (pi, a fraction, K, a layer; None for scalars), ``step`` the
    generation step, ``se`` its Monte-Carlo standard error (None when the metric is deterministic). ``pi=`` is
    the old spelling of ``x=`` (a metric written before the rename keeps working). ``draws``: the value's
    Monte-Carlo draws where the metric gives them (the reliability metric pairs them), never stored."""

    metric: str
    value: float
    x: float | None = None
    step: int | None = None
    se: float | None = None
    pi: InitVar[float | None] = None
    draws: list[float] | None = field(default=None, compare=False, repr=False)  # Monte-Carlo draws, not stored

    def __post_init__(self, pi: float | None) -> None:
        if pi is not None:
            if self.x is not None:
                raise LlmattrError("Row takes x (or its old name pi), not both")
            object.__setattr__(self, "x", pi)


@dataclass(frozen=True)
class Unit:
    """One (model, dataset, example, method, params): the grain of work and of each transaction."""

    model: str
    dataset: str
    example: str
    method: str
    params: str  # canonical JSON

    def as_tuple(self) -> tuple[str, ...]:
        return (self.model, self.dataset, self.example, self.method, self.params)


@dataclass
class MetricOutput:
    """What one metric produced for one unit under one routing."""

    metric: str
    routing: str
    seconds: float
    rows: list[Row] = field(default_factory=list)


def conflicts(old: dict, new: dict) -> str:
    """The settings both give with two values, as ``key: stored OLD vs NEW`` ('' when none). A setting only one
    side gives is no conflict: it belongs to a metric the other side did not run."""
    return ", ".join(f"{k}: stored {old[k]!r} vs {new[k]!r}" for k in sorted(set(old) & set(new)) if old[k] != new[k])


def conflict_advice(old: dict, new: dict) -> str:
    """What to do about a conflict: another rule of the code cannot be rerun, another option value can."""
    rules = [k for k in sorted(set(old) & set(new) & set(RULES)) if old[k] != new[k]]
    if rules:
        rule = rules[0]
        return (f"its values were computed under another rule of the code ({rule} {old[rule]!r}: "
                f"{RULE_VERSIONS.get((rule, old[rule]), 'unknown to this llmattr')}): write to another --out file "
                "(llmattr report still reads this one)")
    return "rerun with the stored settings or write to another --out file"


def _where(columns: tuple[str, ...]) -> str:
    return " AND ".join(f"{c} = ?" for c in columns)


def _check_foreign(path: Path) -> None:
    """Refuse, without changing a byte, an existing file that is not an llmattr store (another program's
    SQLite database, or not SQLite at all)."""
    if not path.exists() or path.stat().st_size == 0:
        return
    try:
        conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
        try:
            tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        finally:
            conn.close()
    except sqlite3.DatabaseError as err:
        raise LlmattrError(f"{path} is not an llmattr results store ({err}); use another --out file") from err
    if tables and "meta" not in tables:
        raise LlmattrError(f"{path} is a SQLite database of another program (tables {', '.join(sorted(tables))}); "
                           "it was left unchanged: use another --out file")


def _lock(path: Path):
    """An exclusive lock on the store for this process, or one line saying another run holds it."""
    handle = open(path, "rb")  # the file exists: sqlite created it
    if fcntl is not None:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as err:
            handle.close()
            raise LlmattrError(f"{path} is being written by another llmattr evaluate, still running: two "
                               "processes took the same shard (under srun or a job array each task finds its own "
                               "in SLURM_PROCID/SLURM_NTASKS or SLURM_ARRAY_TASK_ID, under torchrun in "
                               "RANK/WORLD_SIZE; elsewhere give each --shard i/n) or the same --out; else wait for "
                               "the other run to finish and rerun to complete it") from err
    return handle


def _connect(path: str | Path) -> sqlite3.Connection:
    conn = sqlite3.connect(str(path), timeout=60)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")  # WAL + NORMAL survives a killed process
    conn.executescript(SCHEMA)
    return conn


def _check_meta(conn: sqlite3.Connection, path: str | Path, write: bool) -> str | None:
    """Refuse a store of another schema (a :data:`LEGACY` one is read); a writer also records schema/version in a
    new store, refuses a store written by another llmattr version and brings a legacy store to the current schema
    (its x column's name, its params keys' parameter names). Returns the name of a legacy store's x column
    (``None``: a current store)."""
    meta = dict(conn.execute("SELECT key, value FROM meta"))
    if write and not meta:
        with conn:
            conn.executemany("INSERT INTO meta VALUES (?, ?)",
                             [("schema", str(SCHEMA_VERSION)), ("llmattr_version", __version__)])
        return None
    if meta.get("schema") in LEGACY and (not write or meta.get("llmattr_version") == __version__):
        if not write:
            return LEGACY[meta["schema"]]
        _current_keys(conn)
        recorded = legacy_settings(conn)  # 4 -> 5: the retain rule its pi-Soft values were computed under
        with conn:
            conn.executemany("UPDATE settings SET settings = ? WHERE model = ?",
                             [(json.dumps(settings, sort_keys=True), model) for model, settings in recorded.items()])
            if LEGACY[meta["schema"]] != "x":  # schema 2 -> 3: the column's name
                conn.execute(f"ALTER TABLE results RENAME COLUMN {LEGACY[meta['schema']]} TO x")
            for table in ("explanations", "done", "results"):  # 3 -> 4: the parameters' names in the key
                conn.execute(f"UPDATE {table} SET params = current_key(params) WHERE params != current_key(params)")
            conn.execute("UPDATE meta SET value = ? WHERE key = 'schema'", (str(SCHEMA_VERSION),))
        return None
    if meta.get("schema") != str(SCHEMA_VERSION):
        advice = ": use another --out file or the llmattr version that wrote it" if write else ""
        raise LlmattrError(f"{path} has store schema {meta.get('schema')}, this llmattr reads schema "
                           f"{SCHEMA_VERSION}{advice}")
    if write and meta.get("llmattr_version") != __version__:
        raise LlmattrError(f"{path} was written by llmattr {meta.get('llmattr_version')}, this is "
                           f"{__version__}: write to another --out file rather than mixing versions")
    return None


class Store:
    """A writable store for one process (``llmattr evaluate``)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        if self.path.parent and not self.path.parent.exists():
            self.path.parent.mkdir(parents=True, exist_ok=True)
        _check_foreign(self.path)
        self.path.touch()
        self.lock = _lock(self.path)
        try:
            self.conn = _connect(self.path)
            _check_meta(self.conn, self.path, write=True)
        except sqlite3.DatabaseError as err:
            self.lock.close()
            raise LlmattrError(f"{path} is not an llmattr results store ({err}); "
                               "use another --out file") from err
        except LlmattrError:
            self.lock.close()
            raise

    def close(self) -> None:
        """Checkpoint the write-ahead log into the store file (which then holds everything), then close
        (a second call does nothing)."""
        if self.lock.closed:
            return
        try:
            self.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        finally:
            self.conn.close()
            self.lock.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def settings(self, model: str) -> dict | None:
        """The settings recorded for ``model`` (:func:`current_settings`), None before its first run."""
        row = self.conn.execute("SELECT settings FROM settings WHERE model = ?", (model,)).fetchone()
        return None if row is None else current_settings(row[0])

    def check_settings(self, model: str, settings: dict) -> None:
        """Record ``settings`` for ``model``: added to the stored ones (a store grows by the settings of the metrics
        a run adds), or in their place where nothing of ``model`` is stored yet; refused in one line where a setting
        both give has two values (:func:`conflicts`)."""
        stored = self.settings(model)
        if stored is not None and self.holds(model):
            clash = conflicts(stored, settings)
            if clash:
                raise LlmattrError(f"{self.path} holds results for {model} with other settings ({clash}); "
                                   f"{conflict_advice(stored, settings)}")
            settings = {**stored, **settings}
        with self.conn:
            self.conn.execute("INSERT OR REPLACE INTO settings VALUES (?, ?)",
                              (model, json.dumps(settings, sort_keys=True)))

    def holds(self, model: str) -> bool:
        """Whether anything of ``model`` is stored (an explanation; a run whose every unit failed stores none)."""
        return self.conn.execute("SELECT 1 FROM explanations WHERE model = ? LIMIT 1", (model,)).fetchone() is not None

    def done(self, unit: Unit) -> set[tuple[str, str]]:
        """The (metric, routing) pairs already finished for ``unit``."""
        sql = "SELECT metric, routing FROM done WHERE " + _where(KEY)
        return set(self.conn.execute(sql, unit.as_tuple()))

    def explanation(self, unit: Unit) -> tuple[str, float] | None:
        """The stored Explanation JSON and attribution seconds of ``unit``, if any."""
        sql = "SELECT explanation, attribution_s FROM explanations WHERE " + _where(KEY)
        return self.conn.execute(sql, unit.as_tuple()).fetchone()

    def plan(self, model: str, units: Iterable[tuple[str, str, str, int]], wanted: Iterable[tuple[str, str]]) -> None:
        """Record this run's plan for ``model``: (dataset, method, params, examples) per (dataset, method) and the
        (metric, routing) pairs each unit needs (what ``llmattr status`` counts as the total)."""
        pairs = json.dumps(sorted(wanted))
        with self.conn:
            self.conn.executemany("INSERT OR REPLACE INTO planned VALUES (?, ?, ?, ?, ?, ?)",
                                  [(model, *row, pairs) for row in units])

    def fail(self, unit: Unit, error: str) -> None:
        """Record why ``unit`` could not be evaluated (a later run retries it; its write removes the record)."""
        with self.conn:
            self.conn.execute("INSERT OR REPLACE INTO failed VALUES (?, ?, ?, ?, ?, ?)", (*unit.as_tuple(), error))

    def write(self, unit: Unit, explanation: str, attribution_s: float,
              outputs: Iterable[MetricOutput]) -> None:
        """Write one unit's explanation, metric rows and done markers in a single transaction."""
        key = unit.as_tuple()
        with self.conn:
            self.conn.execute("DELETE FROM failed WHERE " + _where(KEY), key)
            self.conn.execute("INSERT OR IGNORE INTO explanations VALUES (?, ?, ?, ?, ?, ?, ?)",
                              (*key, explanation, attribution_s))
            for out in outputs:
                self.conn.executemany(
                    "INSERT INTO results VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    [(*key, r.metric, out.routing, NONE if r.x is None else round(float(r.x), 9),
                      NONE if r.step is None else int(r.step), float(r.value),
                      None if r.se is None else float(r.se)) for r in out.rows])
                self.conn.execute("INSERT INTO done VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                                  (*key, out.metric, out.routing, out.seconds))


def open_read_only(path: str | Path) -> tuple[sqlite3.Connection, str | None]:
    """A read-only connection to the store at ``path`` (beside a writer: WAL readers do not block it) and the name
    of its x column if it is a legacy store (``None``: current); one line if it is not an llmattr store."""
    try:
        conn = sqlite3.connect(f"{Path(path).resolve().as_uri()}?mode=ro", uri=True)
        return conn, _check_meta(conn, path, write=False)
    except sqlite3.DatabaseError as err:
        raise LlmattrError(f"{path} is not an llmattr results store ({err})") from err


def shards_hint(path: Path) -> str:
    """Where a sharded run wrote ``path``'s results (``results.rank0.sqlite``, ...): the shards named and the glob
    that reads them all, or '' when there are none."""
    shards = sorted(glob.glob(glob.escape(str(path.with_suffix(""))) + ".rank*" + path.suffix))
    if not shards:
        return ""
    pattern = str(path.with_suffix("")) + ".rank*" + path.suffix
    return f" (a sharded run wrote {', '.join(Path(s).name for s in shards)}: give {pattern!r})"


def expand(paths: Iterable[str | Path]) -> list[Path]:
    """Store paths from a list of files and glob patterns, sorted, each once."""
    found: set[Path] = set()
    for item in paths:
        text = str(item)
        matches = glob.glob(text) if any(c in text for c in "*?[") else [text]
        if not matches:
            raise LlmattrError(f"no store matches {text!r}")
        for match in matches:
            if not Path(match).is_file():
                raise LlmattrError(f"store not found: {match}{shards_hint(Path(match))}")
            found.add(Path(match))
    return sorted(found)


class Results:
    """Several stores merged read-only into one in-memory database (``llmattr report``).

    Shards of one run (``results.rank*.sqlite``) are merged; a row present in two stores with two
    different values, or two stores with different settings for one model, is refused.
    ``method_defaults`` (each method's default parameters) make the method labels (:meth:`label`);
    ``datasets`` (each task's ``(report_order, display name)``) the datasets' names and order
    (:meth:`dataset_name`, :meth:`dataset_key`).
    """

    def __init__(self, paths: Iterable[str | Path], method_defaults: Mapping[str, Mapping] | None = None,
                 datasets: Mapping[str, tuple[float, str]] | None = None):
        self.paths = expand(paths)
        self.method_defaults = dict(method_defaults or {})
        self.datasets = dict(datasets or {})
        if not self.paths:
            raise LlmattrError("no store given: pass results.sqlite (or several, or a glob)")
        self.conn = sqlite3.connect(":memory:")
        self.conn.executescript(SCHEMA)
        _current_keys(self.conn)
        self._settings: dict[str, dict] = {}
        for path in self.paths:
            self._merge(path)

    def _merge(self, path: Path) -> None:
        src, legacy = open_read_only(path)
        stored = legacy_settings(src) if legacy else {
            model: current_settings(text) for model, text in src.execute("SELECT model, settings FROM settings")}
        src.close()
        for model, settings in stored.items():
            clash = conflicts(self._settings.get(model, {}), settings)
            if clash:
                raise LlmattrError(f"{path} has other settings for {model} than the stores before it ({clash}); "
                                   "report them separately")
            self._settings[model] = {**self._settings.get(model, {}), **settings}
        self.conn.execute("ATTACH DATABASE ? AS src", (str(path),))
        read = {"params": "current_key(s.params)", "x": f"s.{legacy}"} if legacy else {}  # a legacy store's names
        with self.conn:
            same = " AND ".join(f"{read.get(c, f's.{c}')} = m.{c}" for c in RESULT_KEY)
            clash = self.conn.execute(
                f"SELECT s.model, s.dataset, s.example, s.method, s.metric FROM src.results s JOIN results m "
                f"ON {same} WHERE s.value != m.value LIMIT 1").fetchone()
            if clash:
                raise LlmattrError(f"{path} disagrees with another store on {clash}; these stores are not "
                                   "shards of one run")
            for table in ("explanations", "done", "results"):
                columns = [row[1] for row in self.conn.execute(f"PRAGMA main.table_info({table})")]
                chosen = ", ".join(read.get(c, f"s.{c}") for c in columns)
                self.conn.execute(f"INSERT OR IGNORE INTO {table} SELECT {chosen} FROM src.{table} s")
        self.conn.execute("DETACH DATABASE src")

    # ------------------------------------------------------------------ queries
    def label(self, method: str, params: dict | str) -> str:
        """The method's name plus its parameters that differ from its defaults."""
        return method_label(method, params, self.method_defaults.get(method))

    def dataset_name(self, name: str) -> str:
        """The dataset's display name (its task's ``display``; the name itself when none)."""
        return self.datasets.get(name, (None, name))[1]

    def dataset_key(self, name: str) -> tuple[float, str]:
        """Sort key of the report's datasets: the task's ``report_order``, then the name."""
        return (self.datasets.get(name, (DEFAULT_ORDER, name))[0], name)

    def models(self) -> list[str]:
        rows = self.conn.execute("SELECT DISTINCT model FROM explanations ORDER BY model")
        return [r[0] for r in rows]

    def settings(self, model: str) -> dict:
        return self._settings.get(model, {})

    def values(self, model: str, metric: str, routing: str) -> Iterator[tuple]:
        """(dataset, method, params, example, x, step, value, mc_se) rows, in key order."""
        return self.conn.execute(
            "SELECT dataset, method, params, example, x, step, value, mc_se FROM results "
            "WHERE model = ? AND metric = ? AND routing = ? "
            "ORDER BY dataset, method, params, example, x, step",
            (model, metric, routing))

    def metric_names(self, model: str, routing: str) -> list[str]:
        """The stored value names (``results.metric``) of ``model`` under ``routing``, sorted."""
        rows = self.conn.execute("SELECT DISTINCT metric FROM results WHERE model = ? AND routing = ? ORDER BY metric",
                                 (model, routing))
        return [r[0] for r in rows]

    def explanations(self, model: str) -> Iterator[tuple]:
        """(dataset, method, params, example, explanation JSON, attribution seconds), in key order."""
        return self.conn.execute(
            "SELECT dataset, method, params, example, explanation, attribution_s FROM explanations "
            "WHERE model = ? ORDER BY dataset, method, params, example", (model,))

