"""cache=dynamic: transformers' DynamicCache, which grows with the sequence (the default)."""

from __future__ import annotations

from kvpipe.cache.base import CacheSetup, CacheStrategy


class Dynamic(CacheStrategy):
    name = "dynamic"
    family = "dynamic"
    order = 10
    press_layers = "dense"
    continues_cache = True  # a DynamicCache grows from where it stopped

    def build(self, loaded, longest_prompt: int) -> CacheSetup:
        from transformers import DynamicCache

        def make(capacity: int = 0):
            return DynamicCache(config=loaded.model.config, **self.offloading_kwargs())

        return CacheSetup(requested=self.name, effective=self.name, make_cache=make, is_reference=not self.offloading)
