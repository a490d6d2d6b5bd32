"""press=observed_attention: keep the prompt tokens the prompt itself attended to most (kvpress's
ObservedAttentionPress, after H2O: Zhang et al. 2023, "H2O: Heavy-hitter oracle for efficient
generative inference of large language models"). A token's score is the attention every later
prompt token paid it, averaged over those tokens and over the query heads sharing its KV head. It
reads the attention weights themselves, which only model.attn_implementation=eager returns."""

from __future__ import annotations

from dataclasses import dataclass

from kvpipe.cache.presses.base import Press


class ObservedAttention(Press):
    name = "observed_attention"
    order = 50
    test_overrides = ("press.ratio=0.75", "model.attn_implementation=eager")

    @dataclass
    class Settings:
        ratio: float = 0.5  # the fraction of the prompt's KV removed

    @classmethod
    def search_points(cls) -> list[dict[str, str]]:
        return []  # `kvpipe advise` runs its jobs under the configured attention, sdpa by default

    def attention_refusal(self, attn_implementation: str) -> str | None:
        if attn_implementation == "eager":
            return None
        return (
            f"press={self.name} reads the prompt's attention weights, which only eager attention returns "
            f"({attn_implementation} does not); expected model.attn_implementation=eager"
        )

    def score(self, module, hidden_states, keys, values, attentions, position_embeddings):
        import torch

        batch, kv_heads, tokens = keys.shape[:3]
        # each token is attended by itself and every later one: average over those, not over all
        readers = torch.arange(tokens, 0, -1).to(attentions.device, attentions.dtype)
        scores = attentions.sum(dim=2) / readers
        return scores.view(batch, kv_heads, -1, tokens).mean(dim=2)
