"""The heavy libraries, bound at import and imported on first use (SPEC 1's lazy loading, for modules).

What a user can ask for is declared beside the code that computes it: a method's parameters, defaults and rules on
its class in ``methods/``, a metric's options on its ``Metric`` in ``faithfulness/``, a task in ``tasks/``. Those
modules name torch, transformers, scipy and captum through :func:`lazy`, so importing them (``llmattr explain
--help``, a refusal, a plugin's registration) loads none of these: the first attribute read (``torch.zeros``)
imports the library. A class that derives from one of theirs is made on first use (:func:`derived`)."""

from __future__ import annotations

import functools
import importlib
import sys
from collections.abc import Callable


class Lazy:
    """A module, imported the first time one of its attributes is read."""

    __slots__ = ("_name",)

    def __init__(self, name: str):
        object.__setattr__(self, "_name", name)

    def __getattr__(self, attr: str):
        return getattr(sys.modules.get(self._name) or importlib.import_module(self._name), attr)

    def __setattr__(self, attr: str, value) -> None:
        raise AttributeError(f"set {attr} on the module {self._name} itself, not on its lazy binding")

    def __repr__(self) -> str:
        return f"<lazy module {self._name!r}>"


def lazy(name: str) -> Lazy:
    """The module ``name``, imported when one of its attributes is first read."""
    return Lazy(name)


torch = lazy("torch")
F = lazy("torch.nn.functional")
checkpointing = lazy("torch.utils.checkpoint")
forward_ad = lazy("torch.autograd.forward_ad")
cache_utils = lazy("transformers.cache_utils")


def no_grad(fn: Callable) -> Callable:
    """``fn`` run under ``torch.no_grad()`` (the decorator ``@torch.no_grad()`` would import torch at definition)."""

    @functools.wraps(fn)
    def run(*args, **kwargs):
        with torch.no_grad():
            return fn(*args, **kwargs)

    return run


class Derived:
    """A class with ``body``'s methods over a library class ``base()`` (``torch.autograd.Function``,
    ``TorchFunctionMode``, a transformers cache layer), made on first use: calling it constructs an instance, its
    attributes are the class's (``ScaledGradient.apply``)."""

    def __init__(self, name: str, body: type, base: Callable[[], type]):
        self.name, self.body, self.base = name, body, base

    @functools.cached_property
    def cls(self) -> type:
        return type(self.name, (self.body, self.base()), {"__module__": self.body.__module__,
                                                          "__qualname__": self.name, "__doc__": self.body.__doc__})

    def __call__(self, *args, **kwargs):
        return self.cls(*args, **kwargs)

    def __getattr__(self, attr: str):
        return getattr(self.cls, attr)

    def __instancecheck__(self, obj) -> bool:
        return isinstance(obj, self.body)


def derived(name: str, body: type, base: Callable[[], type]) -> Derived:
    """The class ``name`` of ``body`` over ``base()``, made on first use (:class:`Derived`)."""
    return Derived(name, body, base)
