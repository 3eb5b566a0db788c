"""Issue 35 item 7: ``--help`` of every command and the model-free refusals answer without importing torch or
transformers (checked in a fresh interpreter through ``sys.modules``: a test of imports, not of time), and every
help text is what it was before the fast path (golden files in ``tests/data/cli_help/``, captured from main at
2d915e0). The help of ``explain`` and ``evaluate`` lists the registries through a written view of them
(``llmattr.cli._registered``); a test fails when it disagrees with the registries. Regenerate both deliberately with
``python tests/test_cli_fast.py --regen`` when a method, metric, task or option is added."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from llmattr.cli.view import WRITTEN, written_text

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = ROOT / "tests" / "data" / "cli_help"
COMMANDS = ["", "explain", "evaluate", "evaluate-scores", "finetune", "methods", "report", "status"]
HEAVY = ("torch", "transformers")
RUN = f"""import json, sys
HEAVY = {HEAVY!r}
from llmattr.cli import main
sys.argv = ["llmattr", *json.loads(sys.argv[1])]
code = 0
try:
    main()
except SystemExit as exit:
    code = exit.code
sys.stdout.flush()
print("\\n@@" + json.dumps({{"code": code, "heavy": [m for m in HEAVY if m in sys.modules]}}), file=sys.stderr)
"""


def run_cli(args: list[str]) -> tuple[str, int, list[str], str]:
    """``llmattr ARGS`` in a fresh interpreter at a fixed width without colour: (stdout, exit code, heavy modules
    imported, stderr)."""
    env = {**os.environ, "COLUMNS": "100", "TERM": "dumb", "NO_COLOR": "1", "PYTHONPATH": str(ROOT / "src")}
    env.pop("FORCE_COLOR", None)
    done = subprocess.run([sys.executable, "-c", RUN, json.dumps(args)], env=env, capture_output=True, text=True,
                          timeout=120)
    err, tail = done.stderr.rsplit("@@", 1)
    tail = json.loads(tail)
    return done.stdout, tail["code"], tail["heavy"], err


def golden(command: str) -> Path:
    return GOLDEN / f"{command or 'llmattr'}.txt"


def test_written_view_is_the_registries():
    """The view ``--help`` reads without torch is what the registries hold (else: ``--regen``)."""
    assert WRITTEN.read_text(encoding="utf-8") == written_text()


@pytest.mark.parametrize("command", [pytest.param(c, id=c or "llmattr") for c in COMMANDS])
def test_help_imports_no_torch(command):
    _, code, heavy, _ = run_cli([*([command] if command else []), "--help"])
    assert code == 0
    assert heavy == []


@pytest.mark.parametrize("command", [pytest.param(c, id=c or "llmattr") for c in COMMANDS])
def test_help_unchanged(command):
    out, code, _, _ = run_cli([*([command] if command else []), "--help"])
    assert code == 0
    assert out == golden(command).read_text()


REFUSALS = {  # model-free refusals: each must exit 2 before torch loads
    "status-missing-store": ["status", "/nonexistent/x.sqlite"],
    "finetune-unknown-task": ["finetune", "--task", "nope"],
    "evaluate-scores-missing-file": ["evaluate-scores", "/nonexistent/s.json"],
    "report-missing-store": ["report", "/nonexistent/x.sqlite"],
    "explain-unknown-method": ["explain", "--method", "nope", "hi"],
    "explain-undefined-method": ["explain", "--method", "saliency,decompx", "hi"],
    "evaluate-bad-n": ["evaluate", "--n", "0"],
}


@pytest.mark.parametrize("args", [pytest.param(args, id=name) for name, args in REFUSALS.items()])
def test_model_free_refusal_imports_no_torch(args):
    _, code, heavy, _ = run_cli(args)
    assert code == 2
    assert heavy == []


@pytest.mark.parametrize("name", ["nope", "decompx"])
def test_method_refusal_is_the_registry_line(name):
    """The torch-free refusal of ``explain --method`` prints the line :func:`llmattr.methods.get` raises."""
    from llmattr import methods
    from llmattr.errors import LlmattrError

    with pytest.raises(LlmattrError) as refused:
        methods.get(name)
    _, code, _, err = run_cli(["explain", "--method", name, "hi"])
    assert code == 2
    assert " ".join(err.split()) == f"error: {refused.value}"


if __name__ == "__main__" and sys.argv[1:] == ["--regen"]:
    WRITTEN.write_text(written_text(), encoding="utf-8")  # first: the goldens' subprocesses read it
    GOLDEN.mkdir(parents=True, exist_ok=True)
    for command in COMMANDS:
        golden(command).write_text(run_cli([*([command] if command else []), "--help"])[0])
