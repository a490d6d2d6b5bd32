"""press=snapkv: SnapKV (Li et al. 2024, "SnapKV: LLM knows what you are looking for before
generation"; kvpress's SnapKVPress): the last `press.window` prompt tokens (the observation window,
where a prompt's question sits) vote for the earlier tokens with their attention, averaged over
the window's queries, pooled over `press.kernel` neighbours and over the query heads that share a
KV head. The window itself is always kept. The votes are the attention's own weights where its
implementation returns them (eager), else the window's attention recomputed from the hidden states."""

from __future__ import annotations

from dataclasses import dataclass

from kvpipe.cache.presses.base import Press
from kvpipe.errors import ConfigError

DEFAULT_WINDOW = 64  # kvpress's and the paper's observation window


class SnapKV(Press):
    name = "snapkv"
    order = 30
    needs_queries = True
    test_overrides = ("press.ratio=0.75", "press.window=8")

    @dataclass
    class Settings:
        ratio: float = 0.5  # the fraction of the prompt's KV removed
        window: int = DEFAULT_WINDOW  # the last prompt tokens whose attention scores the rest
        kernel: int = 5  # neighbours each score is pooled over

    def check(self, given: frozenset[str] = frozenset()) -> list[str]:
        warnings = super().check(given)
        if self.settings.window < 1:
            raise ConfigError(
                "press.window",
                self.settings.window,
                "expected a positive number of observing prompt tokens (64 in SnapKV)",
            )
        kernel = self.settings.kernel
        if kernel < 1 or kernel % 2 == 0:
            raise ConfigError("press.kernel", kernel, "expected an odd positive pooling width (5 in SnapKV)")
        return warnings

    def check_prompt(self, prompt_tokens: int) -> None:
        if self.settings.window >= prompt_tokens:
            raise ConfigError(
                "press.window",
                self.settings.window,
                f"expected fewer than the shortest prompt's {prompt_tokens} tokens",
            )

    def protected(self, prompt_tokens: int) -> tuple[int, int]:
        return 0, self.settings.window

    def score(self, module, hidden_states, keys, values, attentions, position_embeddings):
        import torch.nn.functional as F

        from kvpipe.cache.presses._attention import window_attention

        batch, kv_heads, tokens = keys.shape[:3]
        window, kernel = self.settings.window, self.settings.kernel
        if attentions is None:
            attentions = window_attention(module, hidden_states, keys, position_embeddings, window)
        scores = attentions[..., -window:, : tokens - window].float().mean(dim=-2)
        scores = F.avg_pool1d(scores, kernel_size=kernel, padding=kernel // 2, stride=1)
        scores = scores.view(batch, kv_heads, -1, tokens - window).mean(dim=2)
        return F.pad(scores, (0, window))  # the window's own tokens are `protected`
