"""Sources: the documents or sentences of a context as the unit of attribution and of faithfulness.

:class:`Sources` (``spans.py``) says which prompt tokens form each source; it rides on the prompt
(``Prompt.sources``) and on the Explanation.
"""

from .spans import Sources

__all__ = ["Sources"]
