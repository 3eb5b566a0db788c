"""llmattr: which input tokens a decoder-only LLM relied on, and how faithful that explanation is.

The public names load their modules on first use (PEP 562), so ``import llmattr.report`` or ``llmattr
--help`` do not load torch and the models; ``dir(llmattr)`` lists them for tab completion.
"""

import warnings
from importlib import import_module

from .errors import LlmattrError
from .version import __version__

# tqdm.auto (imported by the Hugging Face libraries) warns in every Jupyter kernel without ipywidgets, although
# llmattr draws no tqdm bar (transformers' bars are off, llmattr's are rich's): not the user's problem to fix.
warnings.filterwarnings("ignore", message="IProgress not found", module="tqdm")

_PUBLIC = {"explain": "api", "evaluate": "api", "from_scores": "api", "tokens": "api", "Request": "request",
           "Explanation": "explanation",
           "Explanations": "explanation", "Step": "explanation", "load_model": "models", "wrap_model": "models",
           "finetune": "finetuning", "FinetuneConfig": "finetuning"}


def __getattr__(name: str):
    if name in _PUBLIC:
        return getattr(import_module(f".{_PUBLIC[name]}", __name__), name)
    raise AttributeError(f"module 'llmattr' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_PUBLIC})


__all__ = ["Explanation", "Explanations", "FinetuneConfig", "LlmattrError", "Request", "Step", "evaluate", "explain",
           "finetune", "from_scores", "load_model", "tokens", "wrap_model", "__version__"]
