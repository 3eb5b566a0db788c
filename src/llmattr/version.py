"""The package version (one place: the store records it, ``llmattr --version`` prints it)."""

__version__ = "0.1.0"
