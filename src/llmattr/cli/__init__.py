"""Command-line interface: ``llmattr explain | methods | evaluate | report``.

Sub-command modules in this package register themselves on :data:`app`. A :class:`LlmattrError`
prints one line and exits with status 2.
"""

from __future__ import annotations

import importlib
import pkgutil
import sys

from rich.console import Console
from rich.markup import escape

from ..errors import LlmattrError
from .app import app, load_plugins

for _module in pkgutil.iter_modules(__path__):
    if _module.name not in ("app",) and not _module.name.startswith("_"):
        importlib.import_module(f"{__name__}.{_module.name}")


def main() -> None:
    try:
        load_plugins()  # before the commands are built: a plugin's methods, metrics and tasks get their options
        app()
    except LlmattrError as err:
        Console(stderr=True).print(f"[bold red]error:[/] {escape(str(err))}", highlight=False, soft_wrap=True)
        sys.exit(2)
