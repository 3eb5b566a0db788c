"""``llmattr explain``: explain one text in the terminal, as HTML and as JSON."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console

from ..errors import LlmattrError
from .app import app


def parse_fields(text: str, fields: list[str]) -> str | dict:
    """``--field NAME=VALUE`` options: extra fields of multi-field tasks (BoolQ's question)."""
    if not fields:
        return text
    example = {}
    for item in fields:
        if "=" not in item:
            raise LlmattrError(f"--field expects NAME=VALUE, got {item!r}")
        name, value = item.split("=", 1)
        example[name.strip()] = value
    return {"__text__": text, **example}


def parse_params(items: list[str]) -> dict:
    """``--param NAME=VALUE`` method parameters (numbers are converted)."""
    params: dict = {}
    for item in items:
        if "=" not in item:
            raise LlmattrError(f"--param expects NAME=VALUE, got {item!r}")
        name, value = item.split("=", 1)
        for cast in (int, float):
            try:
                params[name.strip()] = cast(value)
                break
            except ValueError:
                continue
        else:
            params[name.strip()] = value
    return params


@app.command()
def explain(
    text: str = typer.Argument(..., help="The text to explain (the content span of the prompt)."),
    model: str = typer.Option("default", help="'default' (SmolLM2-135M-Instruct), a hub id, a folder or a .gguf."),
    task: str = typer.Option("sentiment", help="Prompt recipe: sentiment, boolq, generate, ..."),
    method: str = typer.Option("grad-ellm", help="Attribution method (see `llmattr methods`)."),
    max_new_tokens: int = typer.Option(None, help="Tokens to generate and explain (task default if unset)."),
    answer: str = typer.Option(None, help="Force this answer text instead of greedy generation."),
    field: list[str] = typer.Option([], help="Extra task field NAME=VALUE (e.g. question=... for boolq)."),
    shots: int = typer.Option(0, help="Few-shot demonstrations (from the task sample data) before the text."),
    param: list[str] = typer.Option([], help="Method parameter NAME=VALUE (e.g. layers=4)."),
    attention: str = typer.Option(None, help="Grad-ELLM token weights: loosened (default) or softmax."),
    layers: str = typer.Option(None, help="Grad-ELLM: number of last layers to aggregate, or 'all'."),
    device: str = typer.Option("auto", help="cpu, cuda or auto."),
    html: Path = typer.Option(None, help="Write a self-contained HTML heatmap here."),
    json: Path = typer.Option(None, help="Write the Explanation JSON here."),
    verbose: bool = typer.Option(False, "--verbose", help="Say where the model folder is."),
) -> None:
    """Explain the model's answer to TEXT: answer, token heatmap, optional HTML and JSON."""
    from ..api import explain as run_explain
    from ..models.loading import load_model
    from ..render import print_explanation, to_html
    from ..tasks import get_task

    console = Console()
    if not text.strip():
        raise LlmattrError("empty text: give the text to explain")
    task_obj = get_task(task)
    params = parse_params(param)
    if attention is not None:
        params["attention"] = attention
    if layers is not None:
        params["layers"] = layers
    content = parse_fields(text, field)
    if isinstance(content, dict):
        content = {task_obj.fields[0]: content.pop("__text__"), **content}
    from .. import methods

    methods.get(method, **params)  # fail fast on a bad method before loading the model
    with console.status(f"loading model {model} ..."):
        lm = load_model(model, device=device, verbose=verbose)
    with console.status(f"explaining with {method} ..."):
        expl = run_explain(content, model=lm, method=method, task=task_obj, max_new_tokens=max_new_tokens,
                           answer=answer, shots=shots, **params)
    print_explanation(expl, console)
    if html is not None:
        html.write_text(to_html(expl))
        console.print(f"wrote {html}")
    if json is not None:
        expl.to_json(json, indent=1)
        console.print(f"wrote {json}")
