"""press=random: drop a random share of the prompt (kvpress's RandomPress): the floor every eviction
study reports, since a press that keeps no better than chance has learned nothing. Scores are drawn
uniformly per token and KV head; with `press.seed` set, from a generator seeded afresh at each layer,
as kvpress draws them (so every layer keeps the same positions, and the same as kvpress keeps)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from kvpipe.cache.presses.base import Press
from kvpipe.errors import ConfigError


class Random(Press):
    name = "random"
    order = 5
    test_overrides = ("press.seed=0",)

    @dataclass
    class Settings:
        ratio: float = 0.5  # the fraction of the prompt's KV removed
        seed: Optional[int] = None  # null: torch's global generator, as kvpress's default

    def check(self, given: frozenset[str] = frozenset()) -> list[str]:
        warnings = super().check(given)
        seed = self.settings.seed
        if seed is not None and not 0 <= seed < 2**63:
            raise ConfigError("press.seed", seed, "expected a seed from 0 to 2**63 - 1, or null for an unseeded draw")
        return warnings

    def score(self, module, hidden_states, keys, values, attentions, position_embeddings):
        import torch

        generator = None
        if self.settings.seed is not None:
            generator = torch.Generator(device=keys.device).manual_seed(self.settings.seed)
        return torch.rand(*keys.shape[:-1], generator=generator, device=keys.device, dtype=keys.dtype)
