"""The house rules of the layout (docs/architecture.md): the report loads no model code, imports go down the
layers, and no llmattr import hides inside a function."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
SRC = ROOT / "src" / "llmattr"
HEAVY = ("torch", "captum", "transformers", "llmattr.evaluation", "llmattr.methods", "llmattr.faithfulness",
         "llmattr.api", "llmattr.models")


def test_the_report_and_status_import_no_model_method_or_evaluation_code():
    code = ("import json, sys, llmattr.report, llmattr.report.queries, llmattr.report.model, llmattr.report.layouts, "
            "llmattr.report.writers, llmattr.report.figures, llmattr.report.html, llmattr.status; "
            "print(json.dumps(sorted(sys.modules)))")
    loaded = json.loads(subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                                       text=True).stdout)
    assert "llmattr.report" in loaded
    heavy = [m for m in loaded if any(m == h or m.startswith(h + ".") for h in HEAVY)]
    assert heavy == []


def test_sources_is_the_torch_free_structure_alone():
    """Sources on one layer (issue 49 item 3): ``llmattr.sources`` (spans, build, split) is a leaf that loads no
    torch and no llmattr module but errors; what runs the model over sources is ``llmattr.methods.source_ablation``."""
    code = ("import json, sys, llmattr.sources, llmattr.sources.build, llmattr.sources.split, llmattr.sources.spans; "
            "print(json.dumps(sorted(sys.modules)))")
    loaded = json.loads(subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                                       text=True).stdout)
    assert "torch" not in loaded and "transformers" not in loaded
    assert {m for m in loaded if m.startswith("llmattr.")} <= {"llmattr.errors", "llmattr.version", "llmattr.sources",
                                                               "llmattr.sources.build", "llmattr.sources.spans",
                                                               "llmattr.sources.split"}
    assert sorted(p.name for p in (SRC / "sources").glob("*.py")) == ["__init__.py", "build.py", "spans.py", "split.py"]


# Imports inside functions, each with its reason. Third-party: optional or heavy dependencies loaded only by
# the feature that needs them. llmattr modules: only the CLI's command bodies (``llmattr --help`` and every
# command module are imported at start, so a command loads its implementation when it runs).
OPTIONAL = {"datasets", "pandas", "IPython", "IPython.display", "platformdirs", "safetensors.torch",
            "transformers", "transformers.utils", "transformers.masking_utils", "socket", "urllib.parse",
            "matplotlib", "matplotlib.pyplot", "matplotlib.colors", "inseq", "peft"}


def late_imports(path: Path) -> list[tuple[int, str]]:
    """``(line, module)`` of every import statement that is not at module level (``TYPE_CHECKING`` blocks
    and ``try``/``except ImportError`` at module level count as module level)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            for inner in ast.walk(node):
                if isinstance(inner, ast.Import):
                    found += [(inner.lineno, alias.name) for alias in inner.names]
                elif isinstance(inner, ast.ImportFrom):
                    found.append((inner.lineno, "." * inner.level + (inner.module or "")))
    return found


def test_no_late_imports_of_llmattr_modules():
    bad = []
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC)
        for line, module in late_imports(path):
            if rel.parts[0] == "cli":
                continue
            if module.startswith(".") or module.startswith("llmattr") or module not in OPTIONAL:
                bad.append(f"{rel}:{line} imports {module} inside a function")
    assert bad == []


def module_name(path: Path) -> str:
    parts = ("llmattr", *path.relative_to(SRC).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(type_checking: bool = False) -> dict[str, set[str]]:
    """``{module: llmattr modules it imports at module level}`` (``TYPE_CHECKING`` blocks left out unless
    ``type_checking``)."""
    modules = {module_name(p): p for p in SRC.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        edges = set()
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test) and not type_checking:
                continue
            for inner in ast.walk(node):
                if isinstance(inner, ast.Import):
                    edges |= {a.name for a in inner.names if a.name in modules}
                elif isinstance(inner, ast.ImportFrom):
                    base = inner.module or ""
                    if inner.level:
                        base = ".".join(package.split(".")[: len(package.split(".")) - inner.level + 1]
                                        + ([inner.module] if inner.module else []))
                    for alias in inner.names:
                        edges.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base)
        graph[name] = {e for e in edges if e in modules and e != name}
    return graph


@pytest.mark.parametrize("type_checking", [False, True], ids=["runtime", "with-type-checking-imports"])
def test_no_import_cycles(type_checking):
    """No module reaches itself through module-level imports (a package and its own submodules aside), nor
    through imports made for type checkers only (a cycle hidden from the interpreter is still a cycle: the
    views of an Explanation go explanation -> render, and render reads explanations by their attributes)."""
    graph = import_graph(type_checking)
    cycles = []
    for start in graph:
        stack, seen = [(start, (start,))], set()
        while stack:
            node, trail = stack.pop()
            for nxt in graph[node]:
                if nxt == start and not all(m.startswith(start + ".") or start.startswith(m + ".")
                                            for m in trail[1:]):
                    cycles.append(" -> ".join((*trail, start)))
                elif nxt not in seen:
                    seen.add(nxt)
                    stack.append((nxt, (*trail, nxt)))
    assert cycles == []


def layer_table() -> dict[str, int]:
    """``{package: layer}`` from docs/architecture.md's table of layers (its rows ``| n | a, b | notes |``)."""
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    rows = text[text.index("| layer | packages | notes |"):].split("\n\n")[0].splitlines()[2:]
    layers = {}
    for row in rows:
        number, packages = (cell.strip() for cell in row.strip("|").split("|")[:2])
        for package in packages.split(","):
            assert package.strip().strip("`") not in layers, f"{package} is on two layers"
            layers[package.strip().strip("`")] = int(number)
    return layers


def package_of(module: str) -> str:
    """``llmattr.methods.source_estimators`` -> ``methods``; the package's ``__init__`` is ``llmattr``."""
    return module.split(".")[1] if "." in module else module


def against_the_layering(graph: dict[str, set[str]], layers: dict[str, int]) -> list[str]:
    """Each import of a module on the importer's own layer or above, as a line."""
    return [f"{a} (layer {layers[package_of(a)]}) imports {b} (layer {layers[package_of(b)]})"
            for a, targets in sorted(graph.items()) for b in sorted(targets)
            if package_of(a) != package_of(b) and layers[package_of(b)] >= layers[package_of(a)]]


@pytest.mark.parametrize("type_checking", [False, True], ids=["runtime", "with-type-checking-imports"])
def test_imports_go_down_the_layers(type_checking):
    """docs/architecture.md's table is the layering: every module is on one layer, and imports only modules on
    layers below its own (none on its own layer: so no circle between folders either)."""
    layers, graph = layer_table(), import_graph(type_checking)
    assert sorted({package_of(m) for m in graph} - set(layers)) == []
    assert sorted(set(layers) - {package_of(m) for m in graph}) == []
    assert against_the_layering(graph, layers) == []


def test_the_layer_check_sees_an_import_against_the_layering():
    """The check above is not vacuous: an import up the layers (sources -> targets, one that issue 49 found) and
    one within a layer (tasks -> objectives) are each found, named with their layers."""
    layers, graph = layer_table(), import_graph()
    graph["llmattr.sources.build"] = graph["llmattr.sources.build"] | {"llmattr.targets"}
    graph["llmattr.tasks.base"] = graph["llmattr.tasks.base"] | {"llmattr.objectives"}
    assert layers["sources"] < layers["targets"] and layers["tasks"] == layers["objectives"]
    assert against_the_layering(graph, layers) == [
        f"llmattr.sources.build (layer {layers['sources']}) imports llmattr.targets (layer {layers['targets']})",
        f"llmattr.tasks.base (layer {layers['tasks']}) imports llmattr.objectives (layer {layers['objectives']})"]


def test_every_module_imports_without_torch():
    """Issue 49 item 1: what a user can ask (the method, metric and task registries, the Request, the configs of
    evaluate and finetune) is importable without torch, so the CLI checks it with the library's own code before any
    model: every module of ``src/llmattr`` is imported and none of the heavy libraries is (``llmattr.lazy`` binds
    them; the first attribute read imports them)."""
    code = ("import importlib, json, pkgutil, sys, llmattr\n"
            "for m in pkgutil.walk_packages(llmattr.__path__, 'llmattr.'):\n"
            "    if not m.name.endswith('__main__'):\n"
            "        importlib.import_module(m.name)\n"
            "print(json.dumps(sorted(sys.modules)))")
    loaded = json.loads(subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                                       text=True).stdout)
    assert "llmattr.methods.deeplift" in loaded and "llmattr.finetuning" in loaded
    assert [m for m in loaded if m.split(".")[0] in ("torch", "transformers", "scipy", "captum", "peft")] == []
