"""llmattr: which input tokens a decoder-only LLM relied on, and how faithful that explanation is."""

from .api import evaluate, explain
from .errors import LlmattrError
from .explanation import Explanation, Step
from .models import load_model, wrap_model
from .version import __version__

__all__ = ["Explanation", "LlmattrError", "Step", "evaluate", "explain", "load_model", "wrap_model", "__version__"]
