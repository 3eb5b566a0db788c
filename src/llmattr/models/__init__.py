"""Model loading, the internals probe and logit helpers."""

from .loading import DEFAULT_MODEL, LoadedModel, cache_dir, load_model, wrap_model
from .probe import LayerRecord, Probe, install_probe

__all__ = ["DEFAULT_MODEL", "LoadedModel", "LayerRecord", "Probe", "cache_dir", "install_probe", "load_model",
           "wrap_model"]
