"""Results kept on a loaded model for the next call with the same inputs: one store (``LoadedModel.kept``).

Some computations repeat, unchanged, across the calls on one model: a task's template prefix (its keys and
values: every example of a task shares them, :func:`~.forward.prefix_cache`), the zero baseline's prefix
(:func:`~.forward.zero_input_logits`) and the template at each point of a path
(:func:`llmattr.methods.integrated.path_prefix`). :class:`Kept` holds them all under one set of rules:

* **one byte budget**, ``KEPT_BYTES`` for every entry of every kind together; the least recently used entry goes
  first, and an entry over the budget alone is not kept (it is computed and used, not stored);
* **one bypass rule**: while an interception that is not transparent is in force (:func:`~.intercept.intercepted`:
  a :class:`~.probe.Probe`, :func:`~.probe.eager_attention`, patched blocks that record; a forward then records or
  computes more than its outputs, so a kept result would skip that work) nothing is kept or read
  (:meth:`Kept.bypassed`, the one place that asks);
* **the weights' version**: every entry is of one version of the weights, each parameter's storage
  (``data_ptr``) and autograd version counter (``_version``), which every in-place operation on a parameter
  bumps (``p.mul_(...)`` under ``torch.no_grad``, an optimizer step, ``load_state_dict``); a call that sees
  another version drops them all first. Computing the version reads every parameter once: about 0.1 ms per call for
  SmolLM2-135M's 272 parameter tensors (``timeit``, CPU; 0.37 ms through ``nn.Module.parameters()``), against
  milliseconds for the forward an entry saves;
* :meth:`Kept.forget` (``LoadedModel.forget``) drops every entry: needed where weights change without their version
  counter, through ``.data`` (``p.data.mul_(...)``, PEFT's LoRA merge); ``llmattr.finetune`` calls it on a model
  it trained in place.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any

from ..lazy import torch
from .intercept import intercepted

KEPT_BYTES = 2**30  # every kept entry of a model together (tensor bytes), the least recently used evicted first


class Kept:
    """Results computed on a model and reused by later calls: an LRU store of tensors within ``budget`` bytes,
    bypassed under interception, emptied whenever the model's weights change version."""

    def __init__(self, budget: int = KEPT_BYTES):
        self.budget = budget
        self.entries: OrderedDict[Hashable, Any] = OrderedDict()  # the least recently used first
        self.sizes: dict[Hashable, int] = {}
        self.version: tuple | None = None  # the weights' version the entries were computed with

    def __len__(self) -> int:
        return len(self.entries)

    @property
    def nbytes(self) -> int:
        return sum(self.sizes.values())

    @staticmethod
    def bypassed() -> bool:
        """Whether nothing may be kept or read now: an interception is in force (:func:`~.intercept.intercepted`)."""
        return intercepted()

    def get(self, model: torch.nn.Module, key: Hashable) -> Any | None:
        """The entry ``key`` of ``model``'s current weights (now the most recently used), or ``None``."""
        if self.bypassed():
            return None
        self.check(model)
        if key in self.entries:
            self.entries.move_to_end(key)
        return self.entries.get(key)

    def keep(self, model: torch.nn.Module, key: Hashable, value: Any) -> Any:
        """Keep ``value`` as the entry ``key`` (replacing one there), evict the least recently used entries until
        all fit the budget; return ``value``. Under interception, or where ``value`` alone is over the budget,
        nothing changes."""
        size = tensor_bytes(value)
        if self.bypassed() or size > self.budget:
            return value
        self.check(model)
        self.drop(key)
        self.entries[key], self.sizes[key] = value, size
        while self.nbytes > self.budget:
            self.drop(next(iter(self.entries)))
        return value

    def fetch(self, model: torch.nn.Module, key: Hashable, compute: Callable[[], Any]) -> Any:
        """The entry ``key``, computed by ``compute()`` and kept where there is none."""
        value = self.get(model, key)
        return self.keep(model, key, compute()) if value is None else value

    def rows(self, model: torch.nn.Module, key: Hashable, rows: torch.Tensor,
             compute: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
        """``compute(rows)`` ``(R, ...)`` for a batch of inputs ``rows`` ``(R, ...)`` of one computation ``key``
        (perturbation masks of one input, say), each distinct row computed once: a row's result is kept under
        ``(key, the row's bytes)``, read back by any later call, and only the rows not kept go to ``compute``, in
        one call. For computations whose rows repeat across calls (the masks over a few sources, which every
        method's metric draws from the same 2^n)."""
        unique, inverse = torch.unique(rows, dim=0, return_inverse=True)
        names = [(key, row.cpu().numpy().tobytes()) for row in unique]
        found = [self.get(model, name) for name in names]
        missing = [i for i, value in enumerate(found) if value is None]
        if missing:
            for i, value in zip(missing, compute(unique[missing]), strict=True):
                found[i] = self.keep(model, names[i], value.clone())
        if not found:
            return compute(unique)
        return torch.stack(found)[inverse.to(found[0].device)]

    def check(self, model: torch.nn.Module) -> None:
        """Drop every entry if ``model``'s weights are not of the version they were computed with."""
        version = weights_version(model)
        if version != self.version:
            self.forget()
            self.version = version

    def drop(self, key: Hashable) -> None:
        self.entries.pop(key, None)
        self.sizes.pop(key, None)

    def forget(self) -> None:
        """Drop every entry (the next call computes them again from the weights as they are)."""
        self.entries.clear()
        self.sizes.clear()
        self.version = None


def weights_version(model: torch.nn.Module) -> tuple:
    """A version of ``model``'s weights: each parameter's storage address and autograd version counter. An in-place
    operation on a parameter (under ``torch.no_grad``, an optimizer's step, ``load_state_dict``) bumps its counter,
    ``p.data = t`` moves its storage; an edit through ``p.data`` does neither (:meth:`Kept.forget`)."""
    return tuple((p.data_ptr(), p._version) for p in parameter_slots(model, []) if p is not None)


def parameter_slots(module: torch.nn.Module, found: list) -> list[torch.nn.Parameter | None]:
    """``found`` extended by the parameter slots of ``module`` and its submodules (``None`` where one registers an
    empty slot, a tied parameter once per module holding it): a walk of the modules' own tables, in a third of
    ``module.parameters()``'s time (which names every module on the way)."""
    found.extend(module._parameters.values())
    for child in module._modules.values():
        if child is not None:
            parameter_slots(child, found)
    return found


def tensor_bytes(value: Any) -> int:
    """Bytes of the tensors in ``value``: a tensor, a list or tuple of values, or an object's attributes."""
    if isinstance(value, torch.Tensor):
        return value.nbytes
    if isinstance(value, list | tuple):
        return sum(tensor_bytes(v) for v in value)
    return sum(tensor_bytes(v) for v in vars(value).values()) if hasattr(value, "__dict__") else 0
