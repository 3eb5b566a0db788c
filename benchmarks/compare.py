"""Run one benchmark at two revisions in the same run and print each figure's ratio with its spread.

    python benchmarks/compare.py [--rounds 3] [--bench-at-revision] REV_A REV_B BENCH [BENCH ARGS...]

In the manner of asv's continuous comparison (``asv continuous A B``): each revision is checked out into its own
temporary git worktree (removed afterwards; ``.`` means the working tree as it is, uncommitted changes included),
and the benchmark runs ``--rounds`` times at each, the rounds interleaved (A B, B A, A B, ...) so that a machine
whose load drifts (a shared CI runner, other jobs) weighs on both revisions alike. Each run is the benchmark script
with ``PYTHONPATH`` set to that revision's ``src``; by default the script is the one of the current tree (one
benchmark measures both revisions, as asv does; old revisions lack new benchmarks), ``--bench-at-revision`` runs
each revision's own copy.

The figures are the numeric cells of the Markdown tables the benchmark prints (``benchmarks/_common.table``), keyed
``row / column``. For each figure the ratio ``B / A`` is taken within each round (the two runs of a round are
neighbours in time) and the table shows the medians at A and B, the median of the per-round ratios and their
spread (min..max over rounds). The mark is ``+`` (B larger) or ``-`` (B smaller) when every round's ratio lies
beyond ``--factor`` on the same side of 1, ``~`` otherwise: a change inside the noise is not called one; ``?``
where a figure is zero or negative in some run (a difference, whose ratio means nothing). Whether
larger is better depends on the figure (seconds: worse; a speed-up: better). The 1-minute load average before
each run is printed with the table; compare ratios, not seconds, across runs.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path

NUMBER = re.compile(r"^[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")
WORKING_TREE = "."


def number(cell: str) -> float | None:
    """The number a table cell starts with (``"1.75x floor"`` -> 1.75, ``"0.031"`` -> 0.031), else ``None``."""
    match = NUMBER.match(cell.strip())
    return float(match.group()) if match else None


def parse_figures(output: str) -> dict[str, float]:
    """Every numeric cell of the Markdown tables in ``output``: ``{"row / column": value}`` (first column is the row
    name; a key seen in an earlier table gets the table's number, ``"row / column #2"``)."""
    figures: dict[str, float] = {}
    lines = output.splitlines()
    table = 0
    for i, line in enumerate(lines[:-1]):
        if not (line.startswith("|") and re.fullmatch(r"\|(?:-+\|)+", lines[i + 1].strip())):
            continue
        table += 1
        header = [c.strip() for c in line.strip().strip("|").split("|")]
        for row in lines[i + 2:]:
            if not row.startswith("|"):
                break
            cells = [c.strip() for c in row.strip().strip("|").split("|")]
            for column, cell in zip(header[1:], cells[1:], strict=False):
                value = number(cell)
                if value is None:
                    continue
                key = f"{cells[0]} / {column}"
                figures[key if key not in figures else f"{key} #{table}"] = value
    return figures


def round_order(rounds: int) -> list[tuple[str, str]]:
    """Which revision runs first in each round: A B, B A, A B, ..."""
    return [("A", "B") if r % 2 == 0 else ("B", "A") for r in range(rounds)]


def summarise(runs: dict[str, list[dict[str, float]]], factor: float) -> list[tuple]:
    """One row per figure present in every run: (figure, median A, median B, median ratio B/A, min ratio,
    max ratio, mark); ratios paired within each round."""
    keys = [k for k in runs["A"][0] if all(k in run for side in "AB" for run in runs[side])]
    rows = []
    for key in keys:
        a = [run[key] for run in runs["A"]]
        b = [run[key] for run in runs["B"]]
        ratios = [y / x for x, y in zip(a, b, strict=True) if x]
        if not ratios:
            continue
        if min(a + b) <= 0:  # a figure at or across zero (a difference): its ratio says nothing
            mark = "?"
        else:
            mark = "+" if min(ratios) > factor else "-" if max(ratios) < 1 / factor else "~"
        rows.append((key, statistics.median(a), statistics.median(b), statistics.median(ratios), min(ratios),
                     max(ratios), mark))
    return rows


def render(rows: list[tuple]) -> str:
    header = ("figure", "A", "B", "B/A", "spread", "")
    body = [(k, f"{a:.4g}", f"{b:.4g}", f"{r:.3f}", f"{lo:.3f}..{hi:.3f}", m) for k, a, b, r, lo, hi, m in rows]
    widths = [max(len(str(r[i])) for r in [header, *body]) for i in range(len(header))]
    line = lambda r: "| " + " | ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True)) + " |"  # noqa: E731
    return "\n".join([line(header), "|" + "|".join("-" * (w + 2) for w in widths) + "|", *map(line, body)])


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout.strip()


@contextmanager
def checkout(repo: Path, revision: str, where: Path):
    """The tree of ``revision`` (a temporary detached worktree at ``where``; ``.``: ``repo`` itself)."""
    if revision == WORKING_TREE:
        yield repo
        return
    sha = git(repo, "rev-parse", "--verify", f"{revision}^{{commit}}")
    git(repo, "worktree", "add", "--detach", str(where), sha)
    try:
        yield where
    finally:
        git(repo, "worktree", "remove", "--force", str(where))


def run_once(tree: Path, script: Path, args: list[str], verbose: bool) -> tuple[dict[str, float], float]:
    """One run of ``script`` against ``tree``'s sources: its figures and the 1-minute load before it."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tree / "src"), os.environ.get("PYTHONPATH", "")])}
    load = os.getloadavg()[0]
    done = subprocess.run([sys.executable, str(script), *args], env=env, cwd=tree, text=True,
                          stdout=subprocess.PIPE, stderr=None if verbose else subprocess.PIPE)
    if done.returncode:
        sys.exit(f"compare: {script.name} failed at {tree} (exit {done.returncode}):\n{(done.stderr or '')[-2000:]}")
    return parse_figures(done.stdout), load


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3, help="runs per revision, interleaved (default 3)")
    parser.add_argument("--factor", type=float, default=1.05, help="ratio beyond which a change is marked")
    parser.add_argument("--bench-at-revision", action="store_true",
                        help="run each revision's own copy of BENCH (default: the current tree's)")
    parser.add_argument("--verbose", action="store_true", help="show the benchmark's stderr")
    parser.add_argument("rev_a")
    parser.add_argument("rev_b")
    parser.add_argument("bench", help="benchmark script, relative to the repository root")
    parser.add_argument("bench_args", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    repo = Path(git(Path.cwd(), "rev-parse", "--show-toplevel"))
    if not (repo / args.bench).is_file():
        parser.error(f"no benchmark {args.bench} in {repo}")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a killed comparison still removes its worktrees
    scratch = Path(tempfile.mkdtemp(prefix="llmattr-compare-"))
    runs: dict[str, list[dict[str, float]]] = {"A": [], "B": []}
    loads: list[float] = []
    try:
        with checkout(repo, args.rev_a, scratch / "a") as tree_a, checkout(repo, args.rev_b, scratch / "b") as tree_b:
            trees = {"A": tree_a, "B": tree_b}
            for r, order in enumerate(round_order(args.rounds)):
                for side in order:
                    script = (trees[side] if args.bench_at_revision else repo) / args.bench
                    figures, load = run_once(trees[side], script, args.bench_args, args.verbose)
                    runs[side].append(figures)
                    loads.append(load)
                    print(f"round {r + 1}/{args.rounds} {side} ({getattr(args, 'rev_' + side.lower())}): "
                          f"{len(figures)} figures, load {load:.2f}", file=sys.stderr, flush=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    rows = summarise(runs, args.factor)
    print(f"A = {args.rev_a}, B = {args.rev_b}: {args.bench} {' '.join(args.bench_args)}; {args.rounds} interleaved "
          f"rounds; 1-minute load before the runs {min(loads):.2f}..{max(loads):.2f}; B/A per round, median and "
          f"spread (min..max); +/-: every round beyond {args.factor}x\n")
    print(render(rows))


if __name__ == "__main__":
    main()
