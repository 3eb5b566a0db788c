"""A torch-free view of the registries for the CLI's help and derived options: each registered method parameter's
help, the tasks, the datasets and their groups, the metrics and each option a metric declares.

The registries themselves import torch (a method, a metric and a task are code). So the view has two sources:
the registries, when they are already loaded in this process (an installed ``llmattr.plugins`` entry point, a
test or a notebook that registered its own method, metric or task imported them: what it registered must be
seen), and otherwise :data:`llmattr.cli._registered.VIEW`, the same view written from the registries of this
source tree, so that ``--help`` answers without importing torch. ``tests/test_cli_fast.py`` fails when the two
disagree; after registering a method, metric or task, ``python tests/test_cli_fast.py --regen`` rewrites it
(and then the help goldens).
"""

from __future__ import annotations

import sys
from pathlib import Path
from pprint import pformat

from ..errors import LlmattrError, method_refusal
from ._registered import VIEW

REGISTRIES = ("llmattr.methods", "llmattr.faithfulness", "llmattr.tasks")  # the packages that hold them
WRITTEN = Path(__file__).with_name("_registered.py")


def registered() -> dict:
    """The view read from the registries (importing them, and torch): ``methods`` (the registered names),
    ``not_defined`` ({name: why}: methods refused for decoder-only models), ``method_params`` ({parameter: [``"method
    default"``, ...]}), ``tasks``, ``datasets``, ``groups`` ({group: datasets}), ``metrics`` and ``metric_options``
    ({name: {flag, type, default, valid, help}})."""
    from .. import methods
    from ..evaluation.run_datasets import dataset_groups, dataset_names
    from ..faithfulness import METRICS, declared_options
    from ..tasks import TASKS

    takers: dict[str, list[str]] = {}
    for name in methods.available():
        for key, value in methods.REGISTRY[name].defaults.items():
            takers.setdefault(key, []).append(f"{name} {value}")
    return {
        "methods": methods.available(),
        "not_defined": dict(sorted(methods.NOT_DEFINED.items())),
        "method_params": dict(sorted(takers.items())),
        "tasks": sorted(TASKS),
        "datasets": list(dataset_names()),
        "groups": {group: list(names) for group, names in dataset_groups().items()},
        "metrics": sorted(METRICS),
        "metric_options": {name: {
            "flag": option.flag,
            "type": type(option.default).__name__ if isinstance(option.default, int | float | str) else "str",
            "default": str(option.default), "valid": [str(v) for v in option.valid or ()], "help": option.help}
            for name, option in sorted(declared_options().items())},
    }


def view() -> dict:
    """The registries' view when they are loaded in this process (what a plugin registered is in them), else the
    written one (no torch)."""
    return registered() if any(name in sys.modules for name in REGISTRIES) else VIEW


def check_methods(names: list[str]) -> None:
    """Refuse an unknown method name with :func:`llmattr.methods.get`'s line, from the view (no torch)."""
    known = view()
    for name in names:
        refusal = method_refusal(name, known["methods"], known["not_defined"])
        if refusal is not None:
            raise LlmattrError(refusal)


def written_text() -> str:
    """The source of ``_registered.py`` for the registries of this process."""
    return ('"""Written by ``python tests/test_cli_fast.py --regen`` from the registries (see '
            ':mod:`llmattr.cli.view`); do not edit."""\n# ruff: noqa: E501\n\nVIEW = '
            + pformat(registered(), width=120, sort_dicts=False) + "\n")
