"""Eviction presses for cache=dynamic and cache=quantized: one module per press, registered on
import, chosen with press=NAME (none by default)."""

from kvpipe.cache.presses.base import PROTOCOLS, QUERY_AGNOSTIC, QUERY_AWARE, Common, Press, get, names, registered
from kvpipe.registry import import_plugins

import_plugins(__name__, __path__)

__all__ = ["PROTOCOLS", "QUERY_AGNOSTIC", "QUERY_AWARE", "Common", "Press", "get", "names", "registered"]
