"""``python -m llmattr`` runs the CLI."""

from .cli import main

main()
