"""llmattr: which input tokens a decoder-only LLM relied on, and how faithful that explanation is."""

from .api import explain
from .errors import LlmattrError
from .explanation import Explanation, Step
from .faithfulness import evaluate
from .models import load_model, wrap_model

__version__ = "0.1.0"
__all__ = ["Explanation", "LlmattrError", "Step", "evaluate", "explain", "load_model", "wrap_model", "__version__"]
