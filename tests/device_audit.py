"""A pytest plugin that runs the CPU suite as if every model lived on another device (docs/scale.md, Running on a GPU).

    PYTHONPATH=src:tests python -m pytest -p device_audit -m "not slow"

Every model's parameters and buffers are tagged "on the device" when llmattr installs its probe; the tag follows
every operation's results, and a tagged tensor reports ``torch.device("cpu", 0)``, so a tensor created with
``device=x.device`` (or moved with ``.to(lm.device)``) is tagged and one created without is not. Like CUDA, an
operation mixing a tagged tensor with an untagged one of more than zero dimensions fails (indexing and copies
excepted, which CUDA allows), as do ``.numpy()`` of a tagged tensor and a CPU generator drawing a tagged result.
Each failure is appended to ``$DEVICE_AUDIT_LOG`` (default ``device-audit.txt``) with the test and the llmattr,
test or benchmark lines that led to it. Not part of ``make test``: a mode of torch functions is several times slower,
and a model offloaded by accelerate (disk, CPU) brings in untagged weights, which it reports as false mixes.
"""

from __future__ import annotations

import functools
import os
import traceback

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten

DEVICE = torch.device("cpu", 0)  # what a tagged tensor reports as its device
MIXING_ALLOWED = {"__getitem__", "__setitem__", "copy_", "index_put_", "index_put", "__format__", "__repr__"}
NUMPY = {"numpy", "__array__"}
PROPERTIES_KEPT = {"grad", "data", "T", "mT", "H", "real", "imag"}  # a tagged tensor's view or gradient is tagged


class DeviceMismatch(RuntimeError):
    """An operation CUDA would refuse: device and CPU tensors mixed."""


def tagged(t) -> bool:
    return isinstance(t, torch.Tensor) and getattr(t, "_on_device", False)


def tag(out, value: bool):
    for t in tree_flatten(out)[0]:
        if isinstance(t, torch.Tensor):
            t._on_device = value
    return out


def on_device(device) -> bool:
    return device == DEVICE or device == "cpu:0"


def report(message: str) -> None:
    frames = [f for f in traceback.extract_stack()[:-3] if any(p in f.filename for p in ("llmattr", "/tests/",
                                                                                        "benchmarks"))]
    where = " <- ".join(f"{os.path.basename(f.filename)}:{f.lineno}" for f in frames[-4:][::-1])
    with open(os.environ.get("DEVICE_AUDIT_LOG", "device-audit.txt"), "a") as log:
        log.write(f"{os.environ.get('PYTEST_CURRENT_TEST', '?')} | {message} | {where}\n")
    raise DeviceMismatch(message)


class DeviceTags(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if name == "__get__":  # a property: .device of a tagged tensor, views and gradients keep the tag
            prop = getattr(getattr(func, "__self__", None), "__name__", "")
            if prop == "device" and tagged(args[0]):
                return DEVICE
            out = func(*args, **kwargs)
            return tag(out, True) if prop in PROPERTIES_KEPT and tagged(args[0]) else out
        tensors = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
        any_tagged = any(tagged(t) for t in tensors)
        if name in NUMPY and any_tagged:
            report(f".{name}() of a device tensor")
        if name == "cpu":
            return tag(func(*args, **kwargs), False)
        if name == "to":
            devices = [a for a in (*args[1:], kwargs.get("device")) if isinstance(a, torch.device | str)]
            others = [a for a in args[1:] if isinstance(a, torch.Tensor)]
            moved = on_device(devices[0]) if devices else tagged(others[0]) if others else tagged(args[0])
            return tag(func(*args, **kwargs), moved)
        device = kwargs.get("device")
        if kwargs.get("generator") is not None and (on_device(device) or (any_tagged and device is None)):
            report(f"a CPU generator draws a device tensor in {name}")
        if any_tagged and name not in MIXING_ALLOWED:
            cpu = [t for t in tensors if not tagged(t) and t.dim() > 0 and not isinstance(t, torch.nn.Parameter)]
            if cpu:
                report(f"{name} mixes device and CPU tensors {[tuple(t.shape) for t in cpu][:3]}")
        out = func(*args, **kwargs)
        return tag(out, on_device(device) if device is not None else any_tagged) if device or any_tagged else out


def pytest_configure(config):
    import llmattr.models.loading as loading

    install = loading.install_probe

    def tagged_install(model):
        tag([*model.parameters(), *model.buffers()], True)
        install(model)

    loading.install_probe = tagged_install
    torch.testing.assert_close = functools.partial(torch.testing.assert_close, check_device=False)  # as conftest
    DeviceTags().__enter__()
