"""Quantization backends for cache=quantized: one module per backend, registered on import
(grouped.py is the base quanto and hqq share)."""

from kvpipe.cache.backends.base import (
    LAYOUTS,
    QuantBackend,
    alternatives,
    axis_numbers,
    backend_axes,
    get,
    names,
    registered,
)
from kvpipe.cache.backends.grouped import GroupedBackend
from kvpipe.registry import import_plugins

import_plugins(__name__, __path__)

__all__ = [
    "LAYOUTS", "GroupedBackend", "QuantBackend", "alternatives", "axis_numbers", "backend_axes", "get", "names",
    "registered",
]  # fmt: skip
