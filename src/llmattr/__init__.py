"""llmattr: which input tokens a decoder-only LLM relied on, and how faithful that explanation is.

The public names load their modules on first use (PEP 562), so ``import llmattr.report`` or ``llmattr
--help`` do not load torch and the models.
"""

from importlib import import_module

from .errors import LlmattrError
from .version import __version__

_PUBLIC = {"explain": "api", "evaluate": "api", "from_scores": "api", "Explanation": "explanation",
           "Step": "explanation", "load_model": "models", "wrap_model": "models", "finetune": "finetuning",
           "FinetuneConfig": "finetuning"}


def __getattr__(name: str):
    if name in _PUBLIC:
        return getattr(import_module(f".{_PUBLIC[name]}", __name__), name)
    raise AttributeError(f"module 'llmattr' has no attribute {name!r}")


__all__ = ["Explanation", "FinetuneConfig", "LlmattrError", "Step", "evaluate", "explain", "finetune", "from_scores",
           "load_model", "wrap_model", "__version__"]
