"""benchmarks/compare.py: the figures it reads from a benchmark's tables, the paired ratios, and a real two-revision
run (a throwaway git repository whose benchmark prints a different number at each commit)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("compare", ROOT / "benchmarks" / "compare.py")
compare = importlib.util.module_from_spec(spec)
spec.loader.exec_module(compare)

OUTPUT = """10 examples, torch threads 2

| method   | median s/example | x floor | note                          |
|----------|------------------|---------|-------------------------------|
| floor    | 0.400            | 1.00    |                               |
| saliency | 0.412            | 1.03    | 1.03x floor: target <= 1.05 met |

| method   | median s/example |
|----------|------------------|
| floor    | 1.5e-1           |
"""


def test_parse_figures_reads_every_numeric_cell_keyed_by_row_and_column():
    figures = compare.parse_figures(OUTPUT)
    assert figures == {
        "floor / median s/example": 0.4, "floor / x floor": 1.0,
        "saliency / median s/example": 0.412, "saliency / x floor": 1.03, "saliency / note": 1.03,
        "floor / median s/example #2": 0.15,
    }


def test_number_takes_the_leading_number_only():
    assert compare.number("1.75x floor") == 1.75
    assert compare.number(" -2e-3 s") == -0.002
    assert compare.number("met") is None
    assert compare.number("") is None


def test_rounds_alternate_which_revision_runs_first():
    assert compare.round_order(4) == [("A", "B"), ("B", "A"), ("A", "B"), ("B", "A")]


def test_ratios_are_paired_within_rounds_and_marked_only_beyond_the_noise():
    runs = {"A": [{"t": 1.0, "u": 2.0}, {"t": 2.0, "u": 2.0}, {"t": 1.0, "u": 2.0}],
            "B": [{"t": 0.5, "u": 2.2}, {"t": 1.2, "u": 1.8}, {"t": 0.4, "u": 2.0}]}
    rows = {row[0]: row for row in compare.summarise(runs, factor=1.05)}
    key, a, b, ratio, low, high, mark = rows["t"]
    assert (a, b) == (1.0, 0.5)
    assert (ratio, low, high) == pytest.approx((0.5, 0.4, 0.6))  # per round 0.5, 0.6, 0.4: not median(B)/median(A)
    assert mark == "-"
    assert rows["u"][3:6] == pytest.approx((1.0, 0.9, 1.1)) and rows["u"][6] == "~"  # straddles 1: no change called
    crossing = {"A": [{"d": 0.2}, {"d": 0.1}], "B": [{"d": -0.1}, {"d": 0.05}]}
    assert compare.summarise(crossing, factor=1.05)[0][6] == "?"  # a difference crossing zero: no ratio reading


def test_two_revisions_in_temporary_worktrees(tmp_path):
    repo = tmp_path / "repo"
    (repo / "src" / "pkg").mkdir(parents=True)
    (repo / "bench").mkdir()
    (repo / "bench" / "b.py").write_text(
        "import sys, pkg\nprint('| name | seconds |')\nprint('|---|---|')\n"
        "print(f'| run | {pkg.T * float(sys.argv[1])} |')\n")

    def commit(value: float) -> str:
        (repo / "src" / "pkg" / "__init__.py").write_text(f"T = {value}\n")
        subprocess.run(["git", "-C", str(repo), "add", "-A"], check=True)
        subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "c"],
                       check=True)
        return subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], check=True, capture_output=True,
                              text=True).stdout.strip()

    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    old = commit(2.0)
    commit(1.0)  # HEAD: never measured, the uncommitted tree is
    (repo / "src" / "pkg" / "__init__.py").write_text("T = 0.5\n")  # uncommitted: what "." measures
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "compare.py"), "--rounds", "2", old, ".",
                           "bench/b.py", "3"], cwd=repo, capture_output=True, text=True, check=True)
    row = next(line for line in done.stdout.splitlines() if line.startswith("| run / seconds"))
    assert [c.strip() for c in row.strip("|").split("|")] == ["run / seconds", "6", "1.5", "0.250", "0.250..0.250",
                                                              "-"]
    assert done.stderr.count("round ") == 4
    worktrees = subprocess.run(["git", "-C", str(repo), "worktree", "list"], capture_output=True, text=True).stdout
    assert len(worktrees.splitlines()) == 1  # the temporary worktrees are gone
