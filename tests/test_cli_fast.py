"""Issue 35 item 7: ``--help`` of every command and every model-free refusal answer without importing torch,
transformers, scipy or matplotlib (checked in a fresh interpreter through ``sys.modules``: a test of imports, not of
time), and every help text and refusal line is what it was before the fast path (golden files in
``tests/data/cli_help/``, captured from main at 2d915e0, and ``tests/data/cli_refusals.json``, from main at 335e1b9,
where 76 of them were torch-free already and the others were refused after importing torch). The help of ``explain``
and ``evaluate`` lists the registries themselves, which import no torch (issue 49: no written copy of them). Rewrite
the help goldens deliberately with ``python tests/test_cli_fast.py --regen`` when a method, metric, task or option is
added."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = ROOT / "tests" / "data" / "cli_help"
COMMANDS = ["", "explain", "evaluate", "evaluate-scores", "finetune", "methods", "report", "status"]
HEAVY = ("torch", "transformers", "scipy", "matplotlib")  # what takes seconds to import
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


def run_cli(args: list[str], src: Path = ROOT / "src", site: Path | None = None, columns: int = 100,
            timeout: int = 120) -> tuple[str, int, list[str], str]:
    """``llmattr ARGS`` (the package in ``src``; ``site``: a folder of installed plugins) in a fresh interpreter in
    the repository's root at a fixed width without colour: (stdout, exit code, heavy modules imported, stderr)."""
    path = os.pathsep.join(str(folder) for folder in (src, site) if folder is not None)
    env = {**os.environ, "COLUMNS": str(columns), "TERM": "dumb", "NO_COLOR": "1", "PYTHONPATH": path}
    env.pop("FORCE_COLOR", None)
    done = subprocess.run([sys.executable, "-c", RUN, json.dumps(args)], env=env, capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT)
    err, tail = done.stderr.rsplit("@@", 1)
    tail = json.loads(tail)
    return done.stdout, tail["code"], tail["heavy"], err


def golden(command: str) -> Path:
    return GOLDEN / f"{command or 'llmattr'}.txt"


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


FILES = "tests/data/cli_refusals"  # a user's bad files (relative: the lines name them as given)
BAD_FILES = {  # each refused by every file reader in one line
    "missing": f"{FILES}/none.csv", "folder": FILES, "latin1": f"{FILES}/latin1.csv",
    "broken-jsonl": f"{FILES}/broken.jsonl", "empty": f"{FILES}/empty.csv", "ragged": f"{FILES}/ragged.csv",
}
ROWS = {  # a readable file whose rows a command refuses: no text column, no label column, an empty text
    "no-text-column": [f"{FILES}/reviews.csv"],
    "no-label-column": [f"{FILES}/reviews.csv", "--text-field", "review"],
    "blank-text": [f"{FILES}/blank.csv"],
}
OUT = ["--out", "/nonexistent/finetuned"]
REFUSALS = {  # model-free refusals: each must exit 2 before torch loads, with the line main printed
    "status-missing-store": ["status", "/nonexistent/x.sqlite"],
    "report-missing-store": ["report", "/nonexistent/x.sqlite"],
    "report-bad-format": ["report", "/nonexistent/x.sqlite", "--format", "xml"],
    "report-bad-bootstrap": ["report", "/nonexistent/x.sqlite", "--bootstrap", "0"],
    "explain-no-text": ["explain"],
    "explain-empty-text": ["explain", ""],
    "explain-blank-text": ["explain", "   "],
    "explain-bad-format": ["explain", "--format", "xml", "hi"],
    "explain-unknown-method": ["explain", "--method", "nope", "hi"],
    "explain-undefined-method": ["explain", "--method", "saliency,decompx", "hi"],
    "explain-bad-param": ["explain", "--param", "foo", "hi"],
    "explain-bad-task": ["explain", "--task", "nope", "hi"],
    "explain-bad-target": ["explain", "--target", "nope", "hi"],
    "explain-bad-scope": ["explain", "--scope", "nope", "hi"],
    "explain-bad-objective": ["explain", "--objective", "nope", "hi"],
    "explain-bad-objective-param": ["explain", "--method", "saliency", "--param", "objective=nope", "hi"],
    "explain-document-and-context": ["explain", "--document", "a", "--context", "c.txt", "q?"],
    "explain-data-and-span": ["explain", "--data", f"{FILES}/blank.csv", "--span", "0:1"],
    "explain-missing-context": ["explain", "--context", f"{FILES}/none.txt", "q?"],
    "explain-html-no-folder": ["explain", "--html", "/nonexistent/dir/x.html", "hi"],
    "explain-json-folder": ["explain", "--json", FILES, "hi"],
    "explain-figure-suffix": ["explain", "--figure", "m.txt", "hi"],
    "explain-plot-without-evaluate": ["explain", "--plot", "p.png", "hi"],
    "explain-bad-routing": ["explain", "--evaluate", "--routing", "sideways", "hi"],
    "explain-bad-samples": ["explain", "--evaluate", "--samples", "0", "hi"],
    "explain-figure-of-several": ["explain", "--method", "saliency,grad-ellm", "--figure", "/tmp/m.png", "hi"],
    "explain-shots-from-missing": ["explain", "--shots", "1", "--shots-from", f"{FILES}/none.csv", "hi"],
    "explain-data-field": ["explain", "--data", f"{FILES}/blank.csv", "--field", "a=b"],
    "explain-data-gold": ["explain", "--data", f"{FILES}/reviews.csv", "--text-field", "review", "--target", "gold"],
    "explain-data-n": ["explain", "--data", f"{FILES}/reviews.csv", "--text-field", "review", "--n", "0"],
    **{f"explain-data-{name}": ["explain", "--data", path, "--text-field", "review"]
       for name, path in BAD_FILES.items()},
    "explain-data-no-text-column": ["explain", "--data", f"{FILES}/reviews.csv"],
    "explain-data-blank-text": ["explain", "--data", f"{FILES}/blank.csv"],
    "explain-unknown-param": ["explain", "--method", "saliency", "--param", "foo=1", "hi"],
    "explain-param-of-another-method": ["explain", "--method", "saliency", "--layers", "4", "hi"],
    "explain-objective-of-attention": ["explain", "--method", "attention", "--objective", "logit", "hi"],
    "explain-contrast-without-foil": ["explain", "--method", "saliency", "--objective", "contrast", "hi"],
    "explain-foil-without-contrast": ["explain", "--foil", "Negative", "hi"],
    "explain-bad-dtype": ["explain", "--dtype", "float8", "hi"],
    "explain-bad-checkpointing": ["explain", "--checkpointing", "sometimes", "hi"],
    "explain-bad-sources": ["explain", "--document", "a", "--sources", "paragraph", "q?"],
    "explain-empty-document": ["explain", "--document", " ", "q?"],
    "explain-document-for-sentiment": ["explain", "--document", "a", "--task", "sentiment", "q?"],
    "explain-span-and-document": ["explain", "--span", "0:2", "--document", "a", "--task", "context", "hello"],
    "explain-bad-span": ["explain", "--span", "2", "hello"],
    "explain-empty-span": ["explain", "--span", "3:1", "hello"],
    "explain-span-outside": ["explain", "--span", "0:99", "hello"],
    "explain-spans-overlap": ["explain", "--span", "0:3", "--span", "2:4", "hello"],
    "explain-unknown-field": ["explain", "--field", "question=x", "hello"],
    "explain-field-without-value": ["explain", "--field", "question", "hello"],
    "evaluate-bad-n": ["evaluate", "--n", "0"],
    "evaluate-bad-dataset": ["evaluate", "--datasets", "sst2,nope"],
    "evaluate-bad-metric": ["evaluate", "--metrics", "pi-soft,nope"],
    "evaluate-bad-method": ["evaluate", "--methods", "nope:layers=4"],
    "evaluate-undefined-method": ["evaluate", "--methods", "decompx"],
    "evaluate-bad-method-param": ["evaluate", "--methods", "grad-ellm:layers"],
    "evaluate-bad-routing": ["evaluate", "--routing", "sideways"],
    "evaluate-data-and-datasets": ["evaluate", "--data", f"{FILES}/reviews.csv", "--datasets", "sst2"],
    "evaluate-data-bad-task": ["evaluate", "--data", f"{FILES}/reviews.csv", "--task", "nope"],
    **{f"evaluate-bad-{option}": ["evaluate", f"--{option}", value] for option, value in (
        ("dtype", "float8"), ("target", "nope"), ("scope", "nope"), ("max-new-tokens", "0"), ("samples", "0"),
        ("coupling", "nope"))},
    "evaluate-out-no-folder": ["evaluate", "--out", "/nonexistent/x.sqlite"],
    "evaluate-bad-shard": ["evaluate", "--shard", "x"],
    "evaluate-shard-out-of-range": ["evaluate", "--shard", "3/2"],
    "evaluate-shards-without-launcher": ["evaluate", "--shards", "2"],
    "evaluate-unknown-launcher": ["evaluate", "--launcher", "cloud", "--shards", "2"],
    "evaluate-launcher-without-shards": ["evaluate", "--launcher", "local"],
    "evaluate-slurm-option-on-local": ["evaluate", "--launcher", "local", "--shards", "2", "--partition", "gpu"],
    "evaluate-bad-time": ["evaluate", "--launcher", "slurm", "--shards", "2", "--time", "0"],
    "evaluate-unknown-method-param": ["evaluate", "--methods", "grad-ellm:foo=1"],
    "evaluate-contrast-without-foil": ["evaluate", "--methods", "saliency:objective=contrast"],
    "evaluate-data-one-label": ["evaluate", "--data", f"{FILES}/reviews.csv", "--text-field", "review",
                                "--label-field", "sentiment", "--labels", "Positive"],
    "evaluate-data-labels-of-generate": ["evaluate", "--data", f"{FILES}/reviews.csv", "--text-field", "review",
                                         "--task", "generate", "--labels", "a,b"],
    "evaluate-config-missing": ["evaluate", "--config", f"{FILES}/none.toml"],
    **{f"evaluate-config-{name}": ["evaluate", "--config", f"{FILES}/config-{name}.toml"]
       for name in ("broken", "unknown", "dtype", "target", "method", "method-param", "n", "samples", "data")},
    **{f"evaluate-data-{name}": ["evaluate", "--data", path] for name, path in BAD_FILES.items()},
    **{f"evaluate-data-{name}": ["evaluate", "--data", *args] for name, args in ROWS.items()},
    **{f"evaluate-scores-{name}": ["evaluate-scores", path] for name, path in BAD_FILES.items()},
    "evaluate-scores-broken-json": ["evaluate-scores", f"{FILES}/broken.json"],
    "evaluate-scores-not-records": ["evaluate-scores", f"{FILES}/numbers.json"],
    "evaluate-scores-bad-routing": ["evaluate-scores", f"{FILES}/numbers.json", "--routing", "sideways"],
    "finetune-unknown-task": ["finetune", *OUT, "--task", "nope"],
    "finetune-bad-loss": ["finetune", *OUT, "--loss", "nope"],
    "finetune-bad-head": ["finetune", *OUT, "--head", "nope"],
    "finetune-generate": ["finetune", *OUT, "--task", "generate"],
    "finetune-regression-task": ["finetune", *OUT, "--task", "stsb"],
    "finetune-head-task-without-head": ["finetune", *OUT, "--task", "sst2-head"],
    "finetune-head-of-generate": ["finetune", *OUT, "--task", "generate", "--head", "classification"],
    "finetune-wrong-head": ["finetune", *OUT, "--task", "sst2", "--head", "regression"],
    "finetune-head-with-lm-loss": ["finetune", *OUT, "--head", "classification", "--loss", "lm"],
    "finetune-permute-lm-loss": ["finetune", *OUT, "--loss", "lm", "--permute-labels"],
    "finetune-bad-mask-augment": ["finetune", *OUT, "--mask-augment", "2"],
    "finetune-mask-augment-lm-loss": ["finetune", *OUT, "--mask-augment", "0.1", "--loss", "lm"],
    "finetune-loss-and-objective": ["finetune", *OUT, "--loss", "lm", "--objective", "label"],
    "finetune-bad-epochs": ["finetune", *OUT, "--epochs", "0"],
    "finetune-bad-learning-rate": ["finetune", *OUT, "--learning-rate", "2"],
    "finetune-bad-lora-r": ["finetune", *OUT, "--lora-r", "-1"],
    "finetune-data-one-label": ["finetune", *OUT, "--task", "sentiment", "--data", f"{FILES}/reviews.csv",
                                "--text-field", "review", "--label-field", "sentiment", "--labels", "Positive"],
    **{f"finetune-data-{name}": ["finetune", *OUT, "--data", path] for name, path in BAD_FILES.items()},
    **{f"finetune-data-{name}": ["finetune", *OUT, "--data", *args] for name, args in ROWS.items()
       if name != "blank-text"},
    "explain-ig-n-steps": ["explain", "--method", "integrated-gradients", "--n-steps", "0", "hi"],
    "explain-ig-batch": ["explain", "--method", "integrated-gradients", "--internal-batch-size", "x", "hi"],
    "explain-ig-path-method": ["explain", "--method", "integrated-gradients", "--param", "method=nope", "hi"],
    "explain-bad-reduction": ["explain", "--method", "saliency", "--reduction", "nope", "hi"],
    "explain-bad-baseline": ["explain", "--method", "integrated-gradients", "--baseline", "nope", "hi"],
    "explain-igcg-threshold": ["explain", "--method", "igcg", "--threshold", "0", "hi"],
    "explain-shap-n-samples": ["explain", "--method", "gradient-shap", "--n-samples", "0", "hi"],
    "explain-grad-ellm-layers": ["explain", "--method", "grad-ellm", "--layers", "x", "hi"],
    "explain-grad-ellm-attention": ["explain", "--method", "grad-ellm", "--attention", "nope", "hi"],
    "explain-grad-ellm-similarity": ["explain", "--method", "grad-ellm", "--similarity", "nope", "hi"],
    "explain-grad-ellm-relu": ["explain", "--method", "grad-ellm", "--relu", "nope", "hi"],
    "explain-attention-layers": ["explain", "--method", "attention", "--layers", "3", "hi"],
    "explain-lime-n-samples": ["explain", "--method", "lime", "--n-samples", "0", "hi"],
    "explain-lime-batch-size": ["explain", "--method", "lime", "--batch-size", "0", "hi"],
    "explain-lime-alpha": ["explain", "--method", "lime", "--alpha", "-1", "hi"],
    "explain-value-zeroing-layers": ["explain", "--method", "value-zeroing", "--layers", "x", "hi"],
    "explain-value-zeroing-batch-size": ["explain", "--method", "value-zeroing", "--batch-size", "0", "hi"],
    "explain-reagent-probes": ["explain", "--method", "reagent", "--num-probes", "0", "hi"],
    "explain-reagent-ratio": ["explain", "--method", "reagent", "--replacing-ratio", "1", "hi"],
    "explain-reagent-sampler": ["explain", "--method", "reagent", "--sampler", "nope", "hi"],
    "explain-contextcite-ablations":
        ["explain", "--method", "contextcite", "--num-ablations", "0", "--document", "a", "q?"],
    "explain-contextcite-batch-size":
        ["explain", "--method", "contextcite", "--batch-size", "x", "--document", "a", "q?"],
    "explain-contextcite-keep-prob":
        ["explain", "--method", "contextcite", "--ablation-keep-prob", "1", "--document", "a", "q?"],
    "explain-contextcite-lasso": ["explain", "--method", "contextcite", "--lasso-alpha", "0", "--document", "a", "q?"],
    "explain-contextcite-prefix": ["explain", "--method", "contextcite", "--prefix", "nope", "--document", "a", "q?"],
    "evaluate-grad-ellm-layers": ["evaluate", "--methods", "grad-ellm:layers=x"],
    "evaluate-ig-n-steps": ["evaluate", "--methods", "integrated-gradients:n_steps=0"],
    "evaluate-lime-batch-size": ["evaluate", "--methods", "lime:batch_size=0"],
    "evaluate-bad-ffid-beta": ["evaluate", "--ffid-beta", "2"],
    "evaluate-permuted-model-missing": ["evaluate", "--permuted-model", "/nonexistent/model"],
    "evaluate-permuted-model-not-model": ["evaluate", "--permuted-model", FILES],
    "evaluate-config-ffid-beta": ["evaluate", "--config", f"{FILES}/config-ffid-beta.toml"],
    "evaluate-bad-max-memory": ["evaluate", "--max-memory", "gpu=2GB"],
    "evaluate-empty-max-memory": ["evaluate", "--max-memory", ","],
    "evaluate-zero-shards": ["evaluate", "--launcher", "local", "--shards", "0"],
    "evaluate-shard-and-shards": ["evaluate", "--launcher", "local", "--shards", "2", "--shard", "0/2"],
    "finetune-out-is-a-file": ["finetune", "--out", f"{FILES}/reviews.csv"],
    "explain-zero-new-tokens": ["explain", "--task", "generate", "--max-new-tokens", "0", "hi"],
    "explain-empty-answer": ["explain", "--task", "generate", "--answer", "", "hi"],
    "evaluate-bad-layers": ["evaluate", "--methods", "grad-ellm", "--layers", "x"],
    "evaluate-bad-layers-of-default-method": ["evaluate", "--layers", "0"],
    "explain-alti-layer": ["explain", "--method", "alti", "--layer", "x", "hi"],
    "explain-logat-layer": ["explain", "--method", "logat", "--layer", "x", "hi"],
    "explain-alti-logit-objective": ["explain", "--method", "alti-logit", "--objective", "probability", "hi"],
    # checked after torch until issue 35's last refusals moved (the lines main printed at 7773234)
    "explain-reagent-mlm-without-model": ["explain", "--method", "reagent", "--sampler", "mlm", "hi"],
    "evaluate-reagent-mlm-without-model": ["evaluate", "--methods", "reagent:sampler=mlm"],
    "evaluate-unknown-reliability-of": ["evaluate", "--metrics", "reliability", "--reliability-of", "soft,nope"],
    "evaluate-reliability-of-itself": ["evaluate", "--reliability-of", "reliability"],
    "evaluate-empty-reliability-of": ["evaluate", "--reliability-of", ","],
    "explain-source-method-without-sources": ["explain", "--method", "leave-one-out", "hi"],
    "explain-source-method-document-sources": ["explain", "--method", "saliency,contextcite", "--sources",
                                               "document", "hi"],
    "explain-data-source-method-without-sources":
        ["explain", "--method", "attribot-hierarchical", "--data", f"{FILES}/reviews.csv", "--text-field", "review"],
    "explain-data-empty-document": ["explain", "--data", f"{FILES}/context-empty-document.jsonl", "--task", "context",
                                    "--method", "leave-one-out"],
    "explain-span-outside-text": ["explain", "--span", "0:9", "hi"],
    "explain-gold-without-word": ["explain", "--task", "blimp-ana", "--target", "gold", "hi"],
    "explain-missing-field": ["explain", "--task", "boolq", "hi"],
    "explain-zero-new-tokens-several-methods":
        ["explain", "--task", "generate", "--max-new-tokens", "0", "--method", "saliency,attention", "hi"],
    "explain-data-empty-answer": ["explain", "--task", "generate", "--answer", "", "--data", f"{FILES}/reviews.csv",
                                  "--text-field", "review"],
    "explain-shots-without-sample-data": ["explain", "--task", "generate", "--shots", "2", "hi"],
    "explain-shots-without-sample-data-several":
        ["explain", "--task", "generate", "--shots", "1", "--method", "saliency,attention", "hi"],
    "evaluate-data-label-not-a-label-word": ["evaluate", "--data", f"{FILES}/labels.csv", "--text-field", "review",
                                             "--label-field", "sentiment"],
    "evaluate-data-label-not-in-labels": ["evaluate", "--data", f"{FILES}/reviews.csv", "--text-field", "review",
                                          "--label-field", "sentiment", "--labels", "Positive,Negative"],
    "evaluate-data-json-label-of-row-id": ["evaluate", "--data", f"{FILES}/labels.jsonl", "--text-field", "review",
                                           "--label-field", "sentiment", "--labels", "0=Negative,1=Positive"],
    "finetune-data-label-not-a-label-word": ["finetune", *OUT, "--task", "sentiment", "--data", f"{FILES}/labels.csv",
                                             "--text-field", "review", "--label-field", "sentiment"],
    "finetune-data-json-label-of-row-id": ["finetune", *OUT, "--task", "sentiment", "--data",
                                           f"{FILES}/labels.jsonl", "--text-field", "review", "--label-field",
                                           "sentiment", "--labels", "0=Negative,1=Positive"],
    "finetune-head-data-label": ["finetune", *OUT, "--head", "classification", "--data", f"{FILES}/labels.csv",
                                 "--text-field", "review", "--label-field", "sentiment"],
    "finetune-head-data-no-text-column": ["finetune", *OUT, "--head", "classification", "--data",
                                          f"{FILES}/reviews.csv"],
    "finetune-head-labels-of-regression": ["finetune", *OUT, "--task", "stsb", "--head", "regression", "--data",
                                           f"{FILES}/scores.csv", "--labels", "a,b"],
    "finetune-no-sample-data": ["finetune", *OUT, "--task", "sentiment"],
    "finetune-head-no-sample-data": ["finetune", *OUT, "--task", "sentiment", "--head", "classification"],
    "finetune-held-out-of-sample-data": ["finetune", *OUT, "--held-out", "5000"],
    "finetune-held-out-of-head-task": ["finetune", *OUT, "--task", "sst2-head", "--head", "classification",
                                       "--held-out", "656"],
    "finetune-held-out-of-data": ["finetune", *OUT, "--task", "sentiment", "--data", f"{FILES}/reviews.csv",
                                  "--text-field", "review", "--label-field", "sentiment", "--held-out", "1"],
    "finetune-out-not-a-finetune": ["finetune", "--out", FILES],
    "finetune-out-finished": ["finetune", "--out", f"{FILES}/finished"],
    "evaluate-n-beyond-balance": ["evaluate", "--datasets", "sst2", "--n", "5000"],
    "evaluate-default-dataset-n-beyond-balance": ["evaluate", "--n", "700"],
    "evaluate-group-n-beyond-balance": ["evaluate", "--datasets", "imdb,blimp,boolq", "--n", "1002"],
    "evaluate-data-n-beyond-balance": ["evaluate", "--data", f"{FILES}/unbalanced.csv", "--text-field", "review",
                                       "--label-field", "sentiment", "--n", "4"],
    "evaluate-config-n-beyond-balance": ["evaluate", "--config", f"{FILES}/config-n-balance.toml"],
    "finetune-held-out-beyond-balance": ["finetune", *OUT, "--task", "sentiment", "--data",
                                         f"{FILES}/unbalanced.csv", "--text-field", "review", "--label-field",
                                         "sentiment", "--held-out", "4"],
    "explain-gold-label-missing": ["explain", "--task", "sst2", "--target", "gold", "hi"],
    "explain-gold-label-not-a-word": ["explain", "--task", "sst2", "--target", "gold", "--field", "label=Maybe", "hi"],
    "explain-gold-label-several-methods": ["explain", "--task", "imdb", "--target", "gold", "--method",
                                           "saliency,attention", "hi"],
    "explain-shots-from-no-column": ["explain", "--task", "sst2", "--shots", "3", "--shots-from",
                                     f"{FILES}/reviews.csv", "hi"],
    "explain-shots-from-label-not-a-word": ["explain", "--task", "sst2", "--shots", "1", "--shots-from",
                                            f"{FILES}/shots-labels.jsonl", "hi"],
    "explain-shots-from-several-methods": ["explain", "--task", "sst2", "--shots", "3", "--shots-from",
                                           f"{FILES}/reviews.csv", "--method", "saliency,attention", "hi"],
    "evaluate-source-method-no-sources": ["evaluate", "--datasets", "sst2", "--methods", "leave-one-out"],
    "evaluate-source-method-in-a-group": ["evaluate", "--datasets", "bio-lookup,blimp", "--methods", "contextcite"],
    "evaluate-source-metric-no-sources": ["evaluate", "--datasets", "sst2", "--methods", "saliency", "--metrics",
                                          "source-gold"],
    "evaluate-source-method-data-no-sources": ["evaluate", "--data", f"{FILES}/reviews.csv", "--text-field",
                                               "review", "--label-field", "sentiment", "--methods",
                                               "attribot-hierarchical"],
    "evaluate-data-randomization-no-permuted-model": ["evaluate", "--metrics", "data-randomization"],
}
REFUSED = ROOT / "tests" / "data" / "cli_refusals.json"  # each refusal's stderr as main printed it at 335e1b9 (the
# first 76, those that were torch-free then, unchanged since 4837f74); the last 43 as main printed them at 7773234


def refusal_line(args: list[str], src: Path = ROOT / "src") -> tuple[int, str]:
    """The exit code and stderr of ``llmattr ARGS``, its whitespace collapsed (rich wraps at the width)."""
    _, code, _, err = run_cli(args, src)
    return code, " ".join(err.split())


@pytest.mark.parametrize("args", [pytest.param(args, id=name) for name, args in REFUSALS.items()])
def test_model_free_refusal_imports_no_torch(args):
    _, code, heavy, _ = run_cli(args)
    assert code == 2
    assert heavy == []


@pytest.mark.parametrize("name", list(REFUSALS))
def test_refusal_unchanged(name):
    """Each model-free refusal prints exactly the line it printed when it still imported torch first."""
    assert refusal_line(REFUSALS[name]) == (2, json.loads(REFUSED.read_text(encoding="utf-8"))[name])


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


if __name__ == "__main__" and sys.argv[1:2] == ["--refusals-from"]:  # SRC: a checkout's src of the reference
    lines = {}
    for name, args in REFUSALS.items():
        code, line = refusal_line(args, Path(sys.argv[2]).resolve())
        assert code == 2, (name, code, line)
        lines[name] = re.sub(r"^explaining ━+ 100% [\d:]+ ", "", line)  # a reference that refused after the model
        # drew its progress bar (at 100%, in a pipe) before the line; a refusal before torch draws none
    REFUSED.write_text(json.dumps(lines, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")

if __name__ == "__main__" and sys.argv[1:] == ["--regen"]:
    GOLDEN.mkdir(parents=True, exist_ok=True)
    for command in COMMANDS:
        golden(command).write_text(run_cli([*([command] if command else []), "--help"])[0])
