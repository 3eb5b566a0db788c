"""Attribution methods, one module per family; ``get(name)`` returns an instance by name."""

from __future__ import annotations

import importlib
import pkgutil

from ..checks import parse_params
from ..errors import LlmattrError, method_refusal
from .base import COUNT, COUNT_OR_AUTO, NOT_DEFINED, REGISTRY, AttributionMethod, choice, layer_parameter, register
from .given import GivenScores

for _module in pkgutil.iter_modules(__path__):
    if not _module.name.startswith("_") and _module.name != "base":
        importlib.import_module(f"{__name__}.{_module.name}")


def available() -> list[str]:
    return sorted(REGISTRY)


def get(name: str, **params) -> AttributionMethod:
    """An attribution method by name, e.g. ``get("grad-ellm", layers=4)``."""
    refusal = method_refusal(name, REGISTRY, NOT_DEFINED)
    if refusal is not None:
        raise LlmattrError(refusal)
    return REGISTRY[name](**params)


__all__ = ["AttributionMethod", "COUNT", "COUNT_OR_AUTO", "GivenScores", "REGISTRY", "available", "choice", "get",
           "layer_parameter", "parse_params", "register"]
