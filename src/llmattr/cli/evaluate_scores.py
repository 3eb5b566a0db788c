"""``llmattr evaluate-scores FILE.json``: pi-Soft-NC/NS of attribution scores computed elsewhere."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.console import Console
from rich.markup import escape

from ..checks import ROUTINGS, one_of, positive_int, writable_file
from ..errors import LlmattrError
from ..readers import read_json
from .app import app

SCORE_KEYS = {"text", "scores", "model", "task", "answer", "method", "signed", "columns", "params"}


def read_records(path: Path, data) -> list[dict]:
    """The records of a scores file (``data``, read from ``path``): one JSON object or a list of them, each either
    an Explanation JSON (with ``steps``) or ``{"text", "scores", ...}`` (:func:`llmattr.api.from_scores`'s
    arguments)."""
    records = data if isinstance(data, list) else [data]
    for i, record in enumerate(records):
        if not isinstance(record, dict) or not ("steps" in record or {"text", "scores"} <= set(record)):
            raise LlmattrError(f"{path} record {i}: give an Explanation JSON or an object with 'text' and 'scores'")
        unknown = sorted(set(record) - SCORE_KEYS) if "steps" not in record else []
        if unknown:
            raise LlmattrError(f"{path} record {i}: unknown key(s) {', '.join(unknown)}; valid: "
                               f"{', '.join(sorted(SCORE_KEYS))}")
    return records


def model_spec(record: dict, model: str | None) -> str:
    """The model to load for a record: ``--model``, else a scores record's ``model``, else "default" (an
    Explanation JSON names its model for display only)."""
    return model or ("default" if "steps" in record else record.get("model", "default"))


def to_explanation(record: dict, lm):
    """An Explanation from one record, on the loaded model ``lm``."""
    from ..api import from_scores
    from ..explanation import Explanation

    if "steps" in record:
        return Explanation.from_json(json.dumps(record))
    args = {key: value for key, value in record.items() if key not in ("text", "scores", "model")}
    return from_scores(record["text"], record["scores"], model=lm, **args)


@app.command("evaluate-scores")
def evaluate_scores(
    file: Path = typer.Argument(..., help="JSON: an Explanation, or {text, scores, model?, task?, answer?, method?, "
                                          "signed?}, or a list of them."),
    model: str = typer.Option(None, help="Model the scores explain (default: each record's 'model', else "
                                         "'default')."),
    routing: str = typer.Option("dynamic", help="dynamic or fixed (clean attention)."),
    samples: int = typer.Option(15, help="Monte-Carlo samples per pi."),
    seed: int = typer.Option(0, help="Seed of the Monte-Carlo masks."),
    json_out: Path = typer.Option(None, "--json", help="Write one result per record (JSON list, each with its "
                                                       "'record' index; a record that failed: its 'error') here."),
) -> None:
    """pi-Soft-NC/NS AUCs (and Soft-NC/NS, E[R]) of attribution scores computed outside llmattr."""
    one_of(routing, ROUTINGS, "--routing")
    positive_int(samples, "--samples")
    if json_out is not None:
        writable_file(json_out, "--json")
    records = read_records(file, read_json(file, "scores file"))
    from ..api import resolve_model
    from ..faithfulness import evaluate

    console = Console()
    results, failed = [], {}
    for i, record in enumerate(records):
        try:
            lm = resolve_model(model_spec(record, model))
            expl = to_explanation(record, lm)
            result = evaluate(expl, lm, routing=routing, samples=samples, seed=seed).to_dict()
        except LlmattrError as err:  # a bad record is named and skipped; the others are kept
            failed[i] = str(err)
            console.print(f"[yellow]{i}: not evaluated:[/] {escape(str(err))}", highlight=False, soft_wrap=True)
            results.append({"record": i, "error": str(err)})
            continue
        metrics = result["metrics"]
        console.print(f"{i}: {expl.method} {expl.generated!r}  AUC pi-Soft-NS {metrics['pi_soft_ns']['auc']:.4f}  "
                      f"AUC pi-Soft-NC {metrics['pi_soft_nc']['auc']:.4f}  (Soft-NS {metrics['soft_ns']:.4f}, "
                      f"Soft-NC {metrics['soft_nc']:.4f}, E[R] {metrics['expected_retained']:.2f})",
                      highlight=False, soft_wrap=True)
        results.append({"record": i, "explanation": expl.to_dict(), **result})
    if json_out is not None:
        json_out.write_text(json.dumps(results, indent=1, ensure_ascii=False))
        console.print(f"wrote {json_out}", highlight=False)
    if failed:
        raise LlmattrError(f"{len(failed)} of {len(records)} record(s) not evaluated (record "
                           f"{', '.join(map(str, failed))}; see above); the others are "
                           + (f"in {json_out}" if json_out is not None else "printed above"))
