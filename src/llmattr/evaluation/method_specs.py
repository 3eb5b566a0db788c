"""Method specs of ``llmattr evaluate``: ``name[:key=value]...`` with its canonical parameters and label."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

from .. import methods as method_registry
from ..checks import split_spec
from ..declarations import method_label
from ..errors import LlmattrError
from ..store import canonical


@dataclass(frozen=True)
class MethodSpec:
    """A method name with its full parameters as canonical JSON (``key``, the store's params column).

    On the CLI: ``name[:param=value]...``, e.g. ``grad-ellm:layers=4:attention=softmax``.
    """

    name: str
    key: str

    @property
    def params(self) -> dict:
        return json.loads(self.key)

    @property
    def label(self) -> str:
        return method_label(self.name, self.key, method_registry.REGISTRY[self.name].defaults)

    def build(self) -> method_registry.AttributionMethod:
        return method_registry.get(self.name, **self.params)


def parse_method(text: str) -> MethodSpec:
    """Parse ``name[:key=value]...``; unknown names and parameters list the valid ones."""
    name, params = split_spec(text)
    method = method_registry.get(name, **params)  # validates name and parameters
    return MethodSpec(method.name, canonical(method.params))


def expand_methods(texts: list[str], layers: list[str] | None = None) -> list[MethodSpec]:
    """Method specs in the given order; ``layers`` sweeps the parameter each method names as its ``layer_sweep``
    (Grad-ELLM's number of aggregated layers) where the text does not set it."""
    specs: list[MethodSpec] = []
    for text in texts:
        spec = parse_method(text)
        swept = method_registry.REGISTRY[spec.name].layer_sweep
        variants = [parse_method(item) for item in swept_texts(text, layers, swept)]
        specs.extend(v for v in variants if v not in specs)
    if not specs:
        raise LlmattrError(f"no method given; valid: {', '.join(method_registry.available())}")
    return specs


def swept_texts(text: str, layers: Sequence | None, swept: str | None) -> list[str]:
    """``evaluate --methods``' item ``text`` as the items it runs: one per value of ``layers`` (``--layers``) with
    the parameter ``swept`` (the method's ``layer_sweep``) set, where the method has one and the text does not set
    it; else the item itself."""
    if layers and swept and swept not in split_spec(text)[1]:
        return [f"{text}:{swept}={k}" for k in layers]
    return [text]
