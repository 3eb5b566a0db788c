"""The suite as a CUDA run sees it, on the CPU: ``--dtype auto`` (the default) loads bfloat16 weights, as it does on
a GPU (docs/scale.md, dtype policy), in the test process and in every CLI it starts (docs/scale.md, Running on a GPU).

    PYTHONPATH=src:tests/dtype_audit python -m pytest -m "not slow"

Python imports this file at start-up from ``PYTHONPATH``; it patches ``llmattr.models.loading.resolve_dtype`` as the
module is first imported (torch stays unimported until then: the torch-free refusal tests still hold). A test that
fails here and passes in ``make test`` compares a model loaded with the default dtype with a float32 reference: on
CUDA it fails the same way. Each model so loaded is named in ``$DTYPE_AUDIT_LOG`` (default ``dtype-audit.txt``),
with the test. Not part of ``make test``.
"""

import importlib.abc
import importlib.util
import os
import sys

TARGET = "llmattr.models.loading"


def patch(module) -> None:
    resolve = module.resolve_dtype

    def resolve_dtype(name, device):
        if name not in (None, "auto"):
            return resolve(name, device)
        with open(os.environ.get("DTYPE_AUDIT_LOG", "dtype-audit.txt"), "a") as log:
            log.write(f"{os.environ.get('PYTEST_CURRENT_TEST', ' '.join(sys.argv[:3]))} | bf16 on {device}\n")
        return module.torch.bfloat16

    module.resolve_dtype = resolve_dtype


class Hook(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != TARGET:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            patch(module)

        spec.loader.exec_module = exec_module
        return spec


sys.meta_path.insert(0, Hook())
