"""press=snapkv: SnapKV (Li et al. 2024, "SnapKV: LLM knows what you are looking for before
generation"; kvpress's SnapKVPress): the last `press.window` prompt tokens (the observation window,
where a prompt's question sits) vote for the earlier tokens with their attention, averaged over
the window's queries, pooled over `press.kernel` neighbours and over the query heads that share a
KV head. The window itself is always kept."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

from kvpipe.cache.presses.base import Press
from kvpipe.errors import ConfigError

DEFAULT_WINDOW = 64  # kvpress's and the paper's observation window


class SnapKV(Press):
    name = "snapkv"
    order = 30
    needs_queries = True
    test_overrides = ("press.window=8",)  # an observation window shorter than the chat prompts
    # model types whose attention kvpipe has read: q_proj, an optional q_norm, then rotary embeddings on
    # every channel (tests/test_presses.py checks each against transformers' own classes)
    QUERY_MODELS = ("llama", "mistral", "mixtral", "qwen2", "qwen3", "gemma", "gemma2", "gemma3", "gemma3_text")

    @dataclass
    class Settings:
        ratio: float = 0.5  # the fraction of the prompt's KV removed
        window: Optional[int] = DEFAULT_WINDOW  # the last prompt tokens whose attention scores the rest
        kernel: int = 5  # neighbours each score is pooled over

    @property
    def window(self) -> int:
        return DEFAULT_WINDOW if self.settings.window is None else self.settings.window

    def check(self) -> list[str]:
        warnings = super().check()
        window, kernel = self.settings.window, self.settings.kernel
        if window is not None and (isinstance(window, bool) or not isinstance(window, int) or window < 1):
            raise ConfigError(
                "press.window", window, "expected a positive number of observing prompt tokens (64 in SnapKV)"
            )
        if isinstance(kernel, bool) or not isinstance(kernel, int) or kernel < 1 or kernel % 2 == 0:
            raise ConfigError("press.kernel", kernel, "expected an odd positive pooling width (5 in SnapKV)")
        return warnings

    @classmethod
    def check_for_model(cls, model_type: str, full_layers: int) -> None:
        super().check_for_model(model_type, full_layers)
        if model_type not in cls.QUERY_MODELS:
            raise ConfigError(
                "press.name", cls.name,
                f"press=snapkv recomputes the prompt's queries, and kvpipe reads them only from the attention of "
                f"{', '.join(cls.QUERY_MODELS)}, not {model_type or 'this model'}'s; expected press=knorm or press=streaming",
            )  # fmt: skip

    def check_prompt(self, prompt_tokens: int) -> None:
        if self.window >= prompt_tokens:
            raise ConfigError(
                "press.window", self.window, f"expected fewer than the shortest prompt's {prompt_tokens} tokens"
            )

    def keep(self, keys, values, queries, module):
        import torch
        import torch.nn.functional as F

        batch, kv_heads, tokens, head_dim = keys.shape
        window = queries.shape[-2]
        groups = queries.shape[1] // kv_heads
        scale = getattr(module, "scaling", 1 / math.sqrt(head_dim))
        expanded = (
            keys[:, :, None].expand(batch, kv_heads, groups, tokens, head_dim).reshape(batch, -1, tokens, head_dim)
        )
        logits = torch.matmul(queries.float(), expanded.float().transpose(2, 3)) * scale
        future = torch.ones(window, tokens, dtype=torch.bool, device=keys.device).triu(tokens - window + 1)
        weights = logits.masked_fill(future, float("-inf")).softmax(dim=-1)[..., : tokens - window]
        scores = weights.mean(dim=-2)
        kernel = self.settings.kernel
        scores = F.avg_pool1d(scores, kernel_size=kernel, padding=kernel // 2, stride=1)
        scores = scores.view(batch, kv_heads, groups, tokens - window).mean(dim=2)
        scores = F.pad(scores, (0, window), value=scores.max().item() + 1)  # the window is always kept
        return scores.topk(self.kept(tokens), dim=-1).indices.sort(dim=-1).values
