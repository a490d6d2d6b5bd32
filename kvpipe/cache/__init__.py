"""The cache stage: every strategy (one module each, registered on import) and the registry callers ask.

`get(name)` gives a strategy's class, `registered()` all of them in table order; no other module
names a strategy. Backends for cache=quantized live in `kvpipe.cache.backends`, the same way.
"""

from kvpipe.cache.base import (
    DEFAULT_BASELINE,
    FAMILIES,
    REGISTRY,
    CacheChoice,
    CacheSetup,
    CacheStrategy,
    Family,
    get,
    names,
    registered,
    table_label,
)
from kvpipe.registry import import_plugins

import_plugins(__name__, __path__)

__all__ = [
    "DEFAULT_BASELINE", "FAMILIES", "REGISTRY", "Family", "CacheChoice", "CacheSetup", "CacheStrategy",
    "get", "names", "registered", "table_label",
]  # fmt: skip
