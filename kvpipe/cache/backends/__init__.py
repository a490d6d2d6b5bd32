"""Quantization backends for cache=quantized: one module per backend, registered on import."""

from kvpipe.cache.backends.base import (
    LAYOUTS,
    GroupedBackend,
    QuantBackend,
    alternatives,
    axis_numbers,
    backend_axes,
    get,
    names,
    registered,
)
from kvpipe.registry import import_plugins

import_plugins(__name__, __path__)

__all__ = [
    "LAYOUTS", "GroupedBackend", "QuantBackend", "alternatives", "axis_numbers", "backend_axes", "get", "names",
    "registered",
]  # fmt: skip
