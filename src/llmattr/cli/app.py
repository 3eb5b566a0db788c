"""The typer application; each sub-command lives in its own module of this package."""

import typer

from ..version import __version__

app = typer.Typer(
    name="llmattr", add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
    help="Explain which input tokens an LLM relied on, and measure how faithful the explanation is.",
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"llmattr {__version__}")
        raise typer.Exit()


@app.callback()
def _root(version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                       help="Print the llmattr version and exit.")) -> None:
    """Explain which input tokens an LLM relied on, and measure how faithful the explanation is."""
