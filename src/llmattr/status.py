"""``llmattr status``: how far the shard stores of a run have got, read while the shards write them.

Each store is opened read-only (SQLite's WAL lets a reader in beside the writer without blocking it) and
counted per (model, dataset, method): units done out of the run's plan (the ``planned`` table the run
records when it starts; a store written before it was recorded has no total), the units the run could not
evaluate (``failed``), and an ETA from the store's own timings: each (dataset, method)'s units left times
the mean wall time (attribution + metrics) of its finished units. Shards run side by side, so the run's ETA
is the slowest shard's.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from .store import expand, open_read_only


@dataclass
class Line:
    """One (model, dataset, method, params) of a store: units done of ``total`` (None: not recorded)."""

    model: str
    dataset: str
    method: str
    params: str
    done: int = 0
    total: int | None = None
    failed: int = 0
    seconds: float = 0.0  # wall time of the done units
    eta_s: float | None = None

    def label(self, siblings: list[str]) -> str:
        """The method's name, plus the parameters in which it differs from the same method's other lines."""
        mine = json.loads(self.params)
        others = [json.loads(p) for p in siblings if p != self.params]
        differ = sorted(k for k in mine if any(o.get(k) != mine[k] for o in others))
        return ":".join([self.method, *(f"{k}={mine[k]}" for k in differ)])


@dataclass
class ShardStatus:
    """The status of one store: its lines, its failures (``dataset/example method: error``) and its ETA."""

    path: Path
    lines: list[Line] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)

    @property
    def done(self) -> int:
        return sum(line.done for line in self.lines)

    @property
    def total(self) -> int | None:
        totals = [line.total for line in self.lines]
        return None if not totals or None in totals else sum(totals)

    @property
    def eta_s(self) -> float | None:
        etas = [line.eta_s for line in self.lines]
        return None if None in etas else sum(etas)


def read_status(path: Path) -> ShardStatus:
    """Count one store's units done, planned and failed per (model, dataset, method), and its ETA."""
    conn, _ = open_read_only(path)
    tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    lines: dict[tuple[str, ...], Line] = {}
    wanted: dict[tuple[str, ...], set] = {}
    if "planned" in tables:
        for *key, examples, pairs in conn.execute("SELECT * FROM planned"):
            lines[tuple(key)] = Line(*key, total=examples)
            wanted[tuple(key)] = {tuple(p) for p in json.loads(pairs)}
    finished: dict[tuple[str, ...], set] = defaultdict(set)
    seconds: dict[tuple[str, ...], float] = defaultdict(float)
    for *unit, metric, routing, secs in conn.execute(
            "SELECT model, dataset, method, params, example, metric, routing, seconds FROM done"):
        finished[tuple(unit)].add((metric, routing))
        seconds[tuple(unit)] += secs
    for *unit, secs in conn.execute("SELECT model, dataset, method, params, example, attribution_s FROM explanations"):
        seconds[tuple(unit)] += secs
    for unit, pairs in finished.items():
        line = lines.setdefault(unit[:4], Line(*unit[:4]))
        if pairs >= wanted.get(unit[:4], set()):
            line.done += 1
            line.seconds += seconds[unit]
    status = ShardStatus(path)
    if "failed" in tables:
        for model, dataset, example, method, params, error in conn.execute("SELECT * FROM failed ORDER BY 1, 2, 4, 3"):
            lines.setdefault((model, dataset, method, params), Line(model, dataset, method, params)).failed += 1
            status.failures.append(f"{dataset}/{example} {method}: {error}")
    conn.close()
    done = [line for line in lines.values() if line.done]
    mean_all = sum(line.seconds for line in done) / sum(line.done for line in done) if done else None
    for line in lines.values():
        mean = line.seconds / line.done if line.done else mean_all
        left = None if line.total is None else max(line.total - line.done, 0)
        line.eta_s = 0.0 if left == 0 else None if left is None or mean is None else left * mean
    status.lines = sorted(lines.values(), key=lambda line: (line.model, line.dataset, line.method, line.params))
    return status


def read_statuses(paths: list[str]) -> list[ShardStatus]:
    """The status of every store named by ``paths`` (files or globs), in path order."""
    return [read_status(path) for path in expand(paths)]


def as_json(statuses: list[ShardStatus]) -> dict:
    """The statuses as plain data (``llmattr status --json``)."""
    stores = [{"path": str(s.path), "done": s.done, "total": s.total, "failed": len(s.failures), "eta_s": s.eta_s,
               "lines": [{"model": line.model, "dataset": line.dataset, "method": line.method,
                          "params": json.loads(line.params), "done": line.done, "total": line.total,
                          "failed": line.failed, "eta_s": line.eta_s} for line in s.lines],
               "failures": s.failures} for s in statuses]
    totals = [s.total for s in statuses]
    etas = [s.eta_s for s in statuses]
    return {"stores": stores, "done": sum(s.done for s in statuses),
            "total": None if None in totals else sum(totals), "eta_s": None if None in etas else max(etas)}
