"""press=tova: TOVA (Oren et al. 2024, "Transformers are multi-state RNNs"; kvpress's TOVAPress): keep
the prompt tokens the last one attends to most. As in kvpress, its attention is averaged over every
query head (not per KV group), so all KV heads keep the same positions; the last token itself is
always kept. The weights are the attention's own where its implementation returns them (eager),
else the last query's attention recomputed from its hidden state."""

from __future__ import annotations

from dataclasses import dataclass

from kvpipe.cache.presses.base import Press


class Tova(Press):
    name = "tova"
    order = 40
    needs_queries = True
    test_overrides = ("press.ratio=0.75",)

    @dataclass
    class Settings:
        ratio: float = 0.5  # the fraction of the prompt's KV removed

    def protected(self, prompt_tokens: int) -> tuple[int, int]:
        return 0, 1

    def score(self, module, hidden_states, keys, values, attentions, position_embeddings):
        from kvpipe.cache.presses._attention import window_attention

        if attentions is None:
            attentions = window_attention(module, hidden_states, keys, position_embeddings, 1)
        scores = attentions[..., -1, :].float().mean(dim=1, keepdim=True)  # [batch, 1, tokens]
        return scores.expand(-1, keys.shape[1], -1)  # the last token is `protected`
