"""The CLI on the embedded model: piped output shows numbers and exact Arabic, --format json, --layers as an
int, load time, figures, evaluate-scores, two evaluate runs on one store, Ctrl-C's resume message."""

import fcntl
import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import time

import pytest

pytestmark = pytest.mark.slow
ARABIC = "هذا الفيلم رائع جدا"


def run_cli(*args, timeout=600):
    return subprocess.run([sys.executable, "-m", "llmattr", *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "COLUMNS": "400"})


def start_cli(*args):
    return subprocess.Popen([sys.executable, "-m", "llmattr", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, preexec_fn=default_sigint)


def default_sigint() -> None:
    """Ctrl-C acts in the child even when pytest itself runs as a background job (a non-interactive shell's ``&``
    sets SIGINT to ignored, Python then installs no KeyboardInterrupt handler, and the interrupt is lost)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_piped_arabic_heatmap_with_numbers_html_and_figure(tmp_path):
    page, figure = tmp_path / "h.html", tmp_path / "m.png"
    result = run_cli("explain", ARABIC, "--method", "input-x-gradient", "--html", str(page), "--figure", str(figure))
    assert result.returncode == 0, result.stderr
    values = re.findall(r"\[(-?[0-9.e+-]+)\]", result.stdout)  # piped: every token's value is printed
    assert re.search(r"blue -?[0-9.e+-]+ < 0 < red [0-9.e+-]+", result.stdout) and len(values) >= len(ARABIC.split())
    # every character in order, none replaced; the numbers (and the space after each, where a line may wrap
    # without breaking a number) stand between the tokens, so the words are compared without spaces
    shown = re.sub(r"\[[^\]]*\]|\s", "", result.stdout)
    assert ARABIC.replace(" ", "") in shown and "\ufffd" not in result.stdout
    assert "wrote None" not in result.stdout
    assert "\ufffd" not in page.read_text() and "linear-gradient" in page.read_text()
    assert figure.read_bytes()[:4] == b"\x89PNG"


def test_colour_forced_into_files_in_a_16_colour_terminal(tmp_path):
    """``FORCE_COLOR=1 TERM=xterm llmattr explain --data ... > o.txt 2> e.txt``: stdout holds the heatmaps alone
    (no spinner frame, progress bar or warning), blue and red in the terminal's 16 colours and every value;
    the bar is on stderr, drawn once; the one-method page is not titled "side by side"."""
    rows, page = tmp_path / "rows.csv", tmp_path / "rows.html"
    rows.write_text("review\nAn engrossing film that is never boring.\nA dull and tedious mess.\n")
    out, err = tmp_path / "o.txt", tmp_path / "e.txt"
    env = {**os.environ, "FORCE_COLOR": "1", "TERM": "xterm", "COLUMNS": "80"}
    env.pop("COLORTERM", None)
    with out.open("w") as stdout, err.open("w") as stderr:
        code = subprocess.run([sys.executable, "-m", "llmattr", "explain", "--data", str(rows), "--text-field",
                               "review", "--method", "input-x-gradient", "--html", str(page)],
                              stdout=stdout, stderr=stderr, env=env, timeout=600).returncode
    shown, said = out.read_text(), err.read_text()
    assert code == 0, said
    assert "\r" not in shown and "explaining" not in shown and "loading model" not in shown
    assert "Warning" not in shown and "\x1b[?25l" not in shown  # no warning, no live display's hidden cursor
    codes = set(re.findall(r"\x1b\[[0-9;]*?(4[0-7]|10[0-7])m", shown))
    assert codes & {"44", "104"} and codes & {"41", "101"} and "48;2;" not in shown  # 16 colours, blue and red
    assert len(re.findall(r"\[-?[0-9.e+-]+\]", shown)) >= 2 * 7  # every value, colour or not
    assert said.count("explaining") == 1 and "\r" not in said
    assert "<title>llmattr: input-x-gradient on 2 texts</title>" in page.read_text()


def test_format_json_layers_int_load_time_and_evaluate_scores(tmp_path):
    result = run_cli("explain", "A gorgeous, witty film.", "--layers", "4", "--format", "json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)  # stdout is the JSON alone
    assert data["params"]["layers"] == 4 and data["timings"]["load_s"] > 0.05
    a, b = data["span"]
    records = [data, {"text": "A gorgeous, witty film.", "scores": [s["raw"] for s in data["steps"]],
                      "answer": data["generated"], "method": data["method"], "params": data["params"]}]
    path = tmp_path / "scores.json"
    path.write_text(json.dumps(records))
    result = run_cli("evaluate-scores", str(path), "--samples", "1", "--json", str(tmp_path / "out.json"))
    assert result.returncode == 0, result.stderr
    out = json.loads((tmp_path / "out.json").read_text())
    assert len(out) == 2 and out[0]["metrics"] == out[1]["metrics"]  # the same scores, the same AUCs
    assert len(out[1]["explanation"]["steps"][0]["scores"]) == b - a


def done_units(path) -> int:
    """Units a running evaluate has finished (0 before its tables exist)."""
    try:
        with sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=30) as conn:
            return conn.execute("SELECT count(*) FROM done").fetchone()[0]
    except sqlite3.OperationalError:
        return 0


def holds_lock(path):
    try:
        with open(path, "rb") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            fcntl.flock(handle, fcntl.LOCK_UN)
        return False
    except OSError:
        return True


def wait_for_lock(path, proc):
    while not (path.exists() and holds_lock(path)):
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.2)


def test_two_evaluate_runs_on_one_store_and_ctrl_c(tmp_path):
    args = ["evaluate", "--n", "1", "--samples", "1", "--metrics", "soft", "--quiet"]
    shared, single = tmp_path / "shared.sqlite", tmp_path / "single.sqlite"
    first = start_cli(*args, "--out", str(shared))
    wait_for_lock(shared, first)
    first.send_signal(signal.SIGSTOP)  # holds the lock however slowly the second process starts (loaded machine)
    try:
        second = run_cli(*args, "--out", str(shared))
    finally:
        first.send_signal(signal.SIGCONT)
    lines = [line for line in second.stderr.splitlines() if line.strip()]
    assert second.returncode == 2 and len(lines) == 1 and "being written by another llmattr evaluate" in lines[0]
    assert first.wait(timeout=600) == 0, first.communicate()
    assert run_cli(*args, "--out", str(single)).returncode == 0

    def rows(path):
        with sqlite3.connect(path) as conn:
            return sorted(conn.execute("SELECT dataset, example, method, metric, routing, x, step, value "
                                       "FROM results"))

    assert rows(shared) == rows(single) and len(rows(single)) > 0
    assert not (tmp_path / "shared.sqlite-wal").exists() or (tmp_path / "shared.sqlite-wal").stat().st_size == 0

    stopped = tmp_path / "stopped.sqlite"
    proc = start_cli(*args[:2], "3", *args[3:], "--out", str(stopped))  # --n 3
    wait_for_lock(stopped, proc)
    while done_units(stopped) < 1:  # interrupt the loop itself (unit 2 of 3), not the model's loading
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.1)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 130 and "rerun the same command to resume" in err and "Traceback" not in err
