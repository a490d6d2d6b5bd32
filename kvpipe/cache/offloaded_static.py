"""cache=offloaded_static: StaticCache(offloading=True), only the layer in use (and the next) on the GPU."""

from __future__ import annotations

from kvpipe.cache.static import Static
from kvpipe.errors import ConfigError


class OffloadedStatic(Static):
    name = "offloaded_static"
    family = "offloaded"
    order = 40
    offloading = True
    runs_as_without_cuda = "static"  # transformers' offloading asserts CUDA

    def check(self, overridden=frozenset()) -> list[str]:
        if self.settings.compile:
            raise ConfigError("cache.compile", True, Static.refusal("compile"))
        return super().check(overridden)
