"""cache=offloaded: DynamicCache(offloading=True), only the layer in use (and the next) on the GPU."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from kvpipe.cache.dynamic import Dynamic


class Offloaded(Dynamic):
    name = "offloaded"
    family = "offloaded"
    order = 30
    offloading = True
    runs_as_without_cuda = "dynamic"  # transformers' offloading asserts CUDA
    press_layers = None  # its layers move between host and device: kvpipe does not evict from them
    continues_cache = False  # a kept cache between turns is unmeasured where its layers move to the host
    late_defaults = {"offload_only_non_sliding": False}  # DynamicCache's own default

    @dataclass
    class Settings:
        # true: sliding-window layers stay on the GPU, only full-attention layers move (null: false)
        offload_only_non_sliding: Optional[bool] = None
