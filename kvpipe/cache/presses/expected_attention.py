"""press=expected_attention: keep the prompt tokens future queries are expected to attend to most
(Devoto et al. 2025, "Expected attention: KV cache compression by estimating attention from future
queries distribution"; kvpress's ExpectedAttentionPress). The prompt's queries before rotary
embeddings, past the first `press.sinks`, give a mean and covariance; both are rotated by the rotary
embedding averaged over the next `press.future_positions` positions; a key's score is its expected
attention under that Gaussian, exp(k.mu / sqrt(d) + k.cov.k / 2d) normalised over the prompt,
averaged over the query heads sharing its KV head, then (with `press.use_vnorm`) scaled by its
value's norm. The first `press.sinks` tokens are always kept."""

from __future__ import annotations

from dataclasses import dataclass

from kvpipe.cache.presses.base import Press
from kvpipe.errors import ConfigError


class ExpectedAttention(Press):
    name = "expected_attention"
    order = 60
    needs_queries = True
    test_overrides = ("press.ratio=0.75", "press.future_positions=16")

    @dataclass
    class Settings:
        ratio: float = 0.5  # the fraction of the prompt's KV removed
        future_positions: int = 512  # the positions after the prompt whose rotations are averaged
        sinks: int = 4  # first tokens always kept, and left out of the query statistics
        use_covariance: bool = True  # the queries' covariance as well as their mean
        use_vnorm: bool = True  # scale each score by its value's L2 norm
        epsilon: float = 0.0  # added to each score before that scaling

    def check(self, given: frozenset[str] = frozenset()) -> list[str]:
        warnings = super().check(given)
        s = self.settings
        if s.future_positions < 1:
            raise ConfigError(
                "press.future_positions", s.future_positions, "expected a positive count (512 in kvpress)"
            )
        if s.sinks < 0:
            raise ConfigError(
                "press.sinks", s.sinks, "expected a count of first tokens to keep, 0 or more (4 in kvpress)"
            )
        if s.epsilon < 0:
            raise ConfigError("press.epsilon", s.epsilon, "expected 0 or more (0 in kvpress)")
        return warnings

    def check_prompt(self, prompt_tokens: int) -> None:
        if self.settings.sinks >= prompt_tokens - 1:
            raise ConfigError(
                "press.sinks", self.settings.sinks,
                f"the query statistics need at least two prompt tokens past the sinks; expected fewer than "
                f"{prompt_tokens - 1} (the shortest prompt has {prompt_tokens} tokens)",
            )  # fmt: skip

    def protected(self, prompt_tokens: int) -> tuple[int, int]:
        return min(self.settings.sinks, prompt_tokens), 0

    def score(self, module, hidden_states, keys, values, attentions, position_embeddings):
        import math

        import torch
        import torch.nn.functional as F

        from kvpipe.cache.presses._attention import prerope_queries

        s = self.settings
        queries = prerope_queries(module, hidden_states[:, s.sinks :])
        mean = queries.mean(dim=2, keepdim=True)
        centered = queries - mean
        covariance = torch.einsum("bnsi,bnsj->bnij", centered, centered) / queries.shape[2]
        rotation = _mean_rotation(module, mean, hidden_states.shape[1], s.future_positions)
        mean = torch.matmul(mean.squeeze(2), rotation.T)
        covariance = torch.matmul(rotation, torch.matmul(covariance, rotation.T))

        keys, values = keys[:, :, s.sinks :], values[:, :, s.sinks :]
        batch, kv_heads, tokens, head_dim = keys.shape
        groups = queries.shape[1] // kv_heads
        shared = keys[:, :, None].expand(batch, kv_heads, groups, tokens, head_dim).reshape(batch, -1, tokens, head_dim)
        shared = shared.transpose(2, 3)
        scores = torch.matmul(mean.unsqueeze(2), shared).squeeze(2) / math.sqrt(head_dim)
        if s.use_covariance:
            scores += torch.einsum("bhin, bhij, bhjn->bhn", shared, covariance, shared) / head_dim / 2
        scores = F.softmax(scores, dim=-1).view(batch, kv_heads, groups, tokens).mean(dim=2)
        if s.use_vnorm:
            scores = (scores + s.epsilon) * values.norm(dim=-1)
        return F.pad(scores, (s.sinks, 0))  # the sinks are `protected`


def _mean_rotation(module, like, prompt_tokens: int, future_positions: int):
    """The rotary embedding's rotation [head_dim, head_dim], averaged over the positions after the
    prompt, from the model's own rotary class and config (as the model would embed them)."""
    import inspect
    import sys

    import torch

    modeling = sys.modules[type(module).__module__]
    rotary_class = next(getattr(modeling, name) for name in dir(modeling) if name.endswith("RotaryEmbedding"))
    rotary = rotary_class(module.config).to(like.device)
    positions = torch.arange(prompt_tokens, prompt_tokens + future_positions, device=like.device).unsqueeze(0)
    if "layer_type" in inspect.signature(rotary.forward).parameters:  # gemma3: local and global rotations
        cos, sin = rotary(like, positions, module.config.layer_types[module.layer_idx])
    else:
        cos, sin = rotary(like, positions)
    cos, sin = cos[0], sin[0]
    head_dim = module.head_dim
    half = torch.eye(head_dim // 2, device=cos.device, dtype=cos.dtype)
    identity = torch.eye(head_dim, device=cos.device, dtype=cos.dtype)
    swap = torch.zeros((head_dim, head_dim), device=cos.device, dtype=cos.dtype)
    swap[head_dim // 2 :, : head_dim // 2], swap[: head_dim // 2, head_dim // 2 :] = half, -half
    return (cos.unsqueeze(1) * identity + sin.unsqueeze(1) * swap).mean(dim=0)
