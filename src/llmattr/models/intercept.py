"""Interception: the one way into a forward pass (docs/architecture.md).

Whatever makes a forward pass do more than the model's own code is an :class:`Interception`, entered with
``with``: entering starts it and puts it on one stack, leaving takes it off and stops it. There are three kinds,
by where they act:

* **the attention function** (:mod:`.probe`): llmattr's attention function, which every layer calls, reads the
  innermost :class:`~.probe.Probe` (record q, k, v, probabilities, outputs; replay a clean pass's routing; scale
  values) and whether :class:`~.probe.EagerAttention` is in force;
* **patched forwards** (:class:`Patched`): chosen modules' ``forward`` wrapped for the duration; the modules are
  named by role through :mod:`.anatomy` (``patched_blocks``: every decoder block). Activation checkpointing,
  DeepLIFT's blocks, the decompositions' recordings of block and final-norm inputs, value zeroing's taps and
  replays, LRP's activations;
* **rules** (:class:`Rules`, :func:`ruled`): a ``TorchFunctionMode`` that sees the torch calls of a computation,
  around a model's every forward (LRP) or around a whole explained function (DeepLIFT).

A new method enters one of these (or subclasses :class:`Interception`). :func:`intercepted` is the one question
the rest of the code asks: whether an interception that is not ``transparent`` is in force, i.e. a forward pass
now records or computes something beyond its outputs; the kept caches are then neither read nor filled. A
transparent interception leaves a forward pass without gradients exactly as it was (activation checkpointing;
rules that act only on tensors that require a gradient).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from typing import TYPE_CHECKING, TypeVar

from ..lazy import torch
from .anatomy import decoder_blocks

if TYPE_CHECKING:
    from torch.overrides import TorchFunctionMode

_STACK: list[Interception] = []
I = TypeVar("I", bound="Interception")  # noqa: E741


class Interception:
    """Something that intercepts forward passes for the duration of a ``with`` block (module docstring).
    Subclasses set :attr:`transparent` and start/stop what they change."""

    transparent = False  # a forward without gradients computes and records under it what it would without it

    def __enter__(self: I) -> I:
        self.start()
        _STACK.append(self)
        return self

    def __exit__(self, *exc) -> None:
        _STACK.remove(self)
        self.stop()

    def start(self) -> None:
        """Put the interception in place (nothing for those the attention function reads off the stack)."""

    def stop(self) -> None:
        """Undo :meth:`start`."""


def intercepted() -> bool:
    """Whether an interception that is not transparent is in force: a forward pass then records or computes
    something beyond its outputs (kept caches are then neither read nor filled)."""
    return any(not entry.transparent for entry in _STACK)


def innermost(kind: type[I]) -> I | None:
    """The interception of ``kind`` entered last and still in force, ``None`` if there is none."""
    return next((entry for entry in reversed(_STACK) if isinstance(entry, kind)), None)


class Patched(Interception):
    """Each of ``modules``' ``forward`` replaced by ``wrap(its index, its forward)`` for the duration; a forward
    the instance already had (another patch, an accelerate hook) is put back afterwards."""

    def __init__(self, modules: Sequence[torch.nn.Module], wrap: Callable[[int, Callable], Callable],
                 transparent: bool = False):
        self.modules, self.wrap, self.transparent = modules, wrap, transparent
        self.before: list = []

    def start(self) -> None:
        self.before = [module.__dict__.get("forward") for module in self.modules]
        for k, module in enumerate(self.modules):
            module.forward = self.wrap(k, module.forward)

    def stop(self) -> None:
        for module, forward in zip(self.modules, self.before, strict=True):
            if forward is None:
                module.__dict__.pop("forward", None)
            else:
                module.forward = forward


def patched_blocks(model: torch.nn.Module, wrap: Callable[[int, Callable], Callable],
                   transparent: bool = False) -> Patched:
    """:class:`Patched` on every decoder block of ``model`` (:func:`.anatomy.decoder_blocks`)."""
    return Patched(decoder_blocks(model), wrap, transparent)


class Rules(Interception):
    """``mode`` (a ``TorchFunctionMode``) in force for the duration: it sees every torch call made meanwhile.
    Transparent: llmattr's rules act on tensors that require a gradient only."""

    transparent = True

    def __init__(self, mode: TorchFunctionMode):
        self.mode = mode

    def start(self) -> None:
        self.mode.__enter__()

    def stop(self) -> None:
        self.mode.__exit__(None, None, None)


def ruled(model: torch.nn.Module, rules: Callable[[], TorchFunctionMode]) -> Patched:
    """Each call of ``model``'s forward run under a fresh ``rules()`` (:class:`Rules`) for the duration; what is
    computed on its outputs (an objective on the logits) keeps its own gradient."""
    return Patched([model], lambda _, forward: partial(_under, rules, forward), transparent=True)


def _under(rules: Callable[[], TorchFunctionMode], forward: Callable, *args, **kwargs):
    with Rules(rules()):
        return forward(*args, **kwargs)
