"""cache=offloaded: DynamicCache(offloading=True), only the layer in use (and the next) on the GPU."""

from __future__ import annotations

from kvpipe.cache.dynamic import Dynamic


class Offloaded(Dynamic):
    name = "offloaded"
    family = "offloaded"
    order = 30
    offloading = True
    runs_as_without_cuda = "dynamic"  # transformers' offloading asserts CUDA
