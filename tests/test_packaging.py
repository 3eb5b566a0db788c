"""The package's declared Python floor is one it runs on: no module of the standard library newer than it."""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ADDED_IN = {"tomllib": (3, 11), "wsgiref.types": (3, 11)}  # standard-library modules newer than 3.10


def imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    return names | {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module}


def test_requires_python_covers_the_standard_library_it_imports():
    spec = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"]
    floor = tuple(int(part) for part in re.fullmatch(r">=\s*(\d+)\.(\d+)", spec.strip()).groups())
    used = set().union(*(imported_modules(path) for path in (ROOT / "src").rglob("*.py")))
    too_new = {name: ADDED_IN[name] for name in used & ADDED_IN.keys() if ADDED_IN[name] > floor}
    assert not too_new, f"requires-python {spec} but the package imports {too_new}"
