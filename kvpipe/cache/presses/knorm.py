"""press=knorm: drop the prompt tokens whose keys have the largest L2 norm (Devoto et al. 2024, "A
simple and effective L2 norm-based strategy for KV cache compression"; kvpress's KnormPress): keys
with a small norm draw the most attention."""

from __future__ import annotations

from dataclasses import dataclass

from kvpipe.cache.presses.base import Press


class Knorm(Press):
    name = "knorm"
    order = 20

    @dataclass
    class Settings:
        ratio: float = 0.5  # the fraction of the prompt's KV removed

    def keep(self, keys, values, queries, module):
        kept = self.kept(keys.shape[-2])
        return (-keys.float().norm(dim=-1)).topk(kept, dim=-1).indices.sort(dim=-1).values
