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

    test_overrides = ("press.ratio=0.25",)

    def score(self, module, hidden_states, keys, values, attentions, position_embeddings):
        return -keys.float().norm(dim=-1)
