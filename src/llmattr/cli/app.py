"""The typer application; each sub-command lives in its own module of this package."""

import typer

app = typer.Typer(
    name="llmattr", add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
    help="Explain which input tokens an LLM relied on, and measure how faithful the explanation is.",
)


@app.callback()
def _root() -> None:
    """Explain which input tokens an LLM relied on, and measure how faithful the explanation is."""
