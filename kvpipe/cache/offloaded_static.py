"""cache=offloaded_static: StaticCache(offloading=True), only the layer in use (and the next) on the GPU."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from kvpipe.cache.static import Static
from kvpipe.errors import ConfigError


class OffloadedStatic(Static):
    name = "offloaded_static"
    family = "offloaded"
    order = 40
    offloading = True
    runs_as_without_cuda = "static"  # transformers' offloading asserts CUDA
    late_defaults = {"offload_only_non_sliding": True}  # StaticCache's own default

    @dataclass
    class Settings(Static.Settings):
        # true: sliding-window layers stay on the GPU, only full-attention layers move (null: true)
        offload_only_non_sliding: Optional[bool] = None

    def check(self, overridden=frozenset()) -> list[str]:
        if self.settings.compile:
            raise ConfigError("cache.compile", True, Static.refusal("compile"))
        return super().check(overridden)
