"""Shared base of attribution methods and the registry by name (Captum/Inseq layout)."""

from __future__ import annotations

from typing import ClassVar

import torch

from ..errors import LlmattrError
from ..models.loading import LoadedModel
from ..targets import Target

REGISTRY: dict[str, type[AttributionMethod]] = {}


class AttributionMethod:
    """One attribution method. Subclasses set the class attributes and implement :meth:`attribute`.

    ``attribute`` returns raw scores ``(n_steps, n_span_tokens)`` for the content span of ``target``:
    one row per explained generation step.
    """

    name: ClassVar[str]
    family: ClassVar[str]
    summary: ClassVar[str]
    needs_gradients: ClassVar[bool]
    signed: ClassVar[bool]
    cost: ClassVar[str]  # forward/backward passes, in words
    defaults: ClassVar[dict] = {}
    memory_kind: ClassVar[str] = "forward"  # forward | backward | deeplift: see llmattr.models.memory

    def __init__(self, **params):
        unknown = sorted(set(params) - set(self.defaults))
        if unknown:
            valid = ", ".join(sorted(self.defaults)) or "none"
            raise LlmattrError(f"method {self.name} has no parameter {', '.join(unknown)}; valid: {valid}")
        self.params = {**self.defaults, **params}

    def attribute(self, lm: LoadedModel, target: Target) -> torch.Tensor:
        raise NotImplementedError

    def attribute_with_info(self, lm: LoadedModel, target: Target) -> tuple[torch.Tensor, dict]:
        """:meth:`attribute` plus per-step diagnostics ``{name: (n_steps,) values}`` recorded on each
        :class:`~llmattr.explanation.Step` (path methods and DeepLIFT: ``target_delta`` and
        ``convergence_delta``)."""
        return self.attribute(lm, target), {}

    def memory_rows(self, lm: LoadedModel, tokens: int) -> int:
        """Sequences of ``tokens`` one pass holds at once (the memory guard's ``R``)."""
        return 1


def parse_params(items: list[str], usage: str) -> dict:
    """Method parameters from ``key=value`` texts (``--param`` of ``explain``, ``name:key=value`` of
    ``evaluate``); integers and floats are converted, anything else stays text. ``usage`` ends the error
    line of an item without ``=``."""
    params: dict = {}
    for item in items:
        if "=" not in item:
            raise LlmattrError(f"method parameter {item!r} must be key=value ({usage})")
        key, value = (part.strip() for part in item.split("=", 1))
        for cast in (int, float):
            try:
                params[key] = cast(value)
                break
            except ValueError:
                continue
        else:
            params[key] = value
    return params


def register(cls: type[AttributionMethod]) -> type[AttributionMethod]:
    """Class decorator: make a method available by its kebab-case name."""
    REGISTRY[cls.name] = cls
    return cls
