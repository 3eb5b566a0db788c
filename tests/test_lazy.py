"""``llmattr.lazy`` (issue 49): a bound library is imported on the first attribute read, not before; a class over
one of its classes is made on first use, constructs instances of itself and answers ``isinstance`` by its body."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from llmattr.lazy import Lazy, derived, lazy, no_grad


def test_a_bound_module_is_imported_on_its_first_attribute_read():
    code = ("import json, sys\n"
            "from llmattr.lazy import lazy\n"
            "wave = lazy('wave')\n"
            "before = 'wave' in sys.modules\n"
            "error = wave.Error\n"
            "print(json.dumps([before, 'wave' in sys.modules, error.__module__]))")
    done = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    assert json.loads(done.stdout) == [False, True, "wave"]


def test_a_binding_is_read_only_and_names_its_module():
    bound = lazy("math")
    assert isinstance(bound, Lazy) and bound.pi == pytest.approx(3.141592653589793) and "math" in repr(bound)
    with pytest.raises(AttributeError, match="on the module math itself"):
        bound.pi = 3


def test_a_derived_class_is_made_once_over_its_base():
    made = []

    class Base:
        def __init__(self, x):
            self.x = x

    class Body:
        """Doubles."""

        def double(self):
            return 2 * self.x

    Twice = derived("Twice", Body, lambda: made.append(1) or Base)
    assert made == []  # nothing made at definition
    one, two = Twice(3), Twice(4)
    assert (one.double(), two.double()) == (6, 8) and made == [1]  # made on first use, once
    assert type(one).__name__ == "Twice" and type(one).__mro__[1:3] == (Body, Base)
    assert isinstance(one, Twice) and not isinstance(Base(1), Twice) and type(one).__doc__ == "Doubles."


def test_no_grad_runs_the_function_without_gradients():
    import torch

    @no_grad
    def square(x):
        return x * x

    y = square(torch.ones(2, requires_grad=True))
    assert not y.requires_grad and square.__name__ == "square"
