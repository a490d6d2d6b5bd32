"""What a press may rebuild of the prompt's attention from what it receives, where the attention
implementation returns no weights (sdpa, flash): the last tokens' queries and the weights they give
every prompt token. This module imports torch: a press loads it only when it scores."""

from __future__ import annotations

import math

import torch


def window_queries(module, hidden_states, position_embeddings, window: int) -> torch.Tensor:
    """The attention's own queries [batch, heads, window, head_dim] of the last `window` tokens:
    q_proj, q_norm where the model has one, then its rotary embeddings."""
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    queries = prerope_queries(module, hidden_states[:, -window:])
    cos, sin = position_embeddings
    queries, _ = apply_rotary_pos_emb(queries, queries, cos[:, -window:], sin[:, -window:])
    return queries


def prerope_queries(module, hidden_states) -> torch.Tensor:
    """The attention's queries [batch, heads, tokens, head_dim] before rotary embeddings: q_proj, then
    q_norm where the model has one."""
    batch, tokens = hidden_states.shape[:2]
    queries = module.q_proj(hidden_states).view(batch, tokens, -1, module.head_dim).transpose(1, 2)
    return module.q_norm(queries) if hasattr(module, "q_norm") else queries


def window_attention(module, hidden_states, keys, position_embeddings, window: int) -> torch.Tensor:
    """The causal attention weights [batch, heads, window, tokens] (float32) of the last `window` prompt
    tokens over the whole prompt, each query head against the KV head it shares."""
    queries = window_queries(module, hidden_states, position_embeddings, window)
    batch, kv_heads, tokens, head_dim = keys.shape
    groups = queries.shape[1] // kv_heads
    scale = getattr(module, "scaling", 1 / math.sqrt(head_dim))
    shared = keys[:, :, None].expand(batch, kv_heads, groups, tokens, head_dim).reshape(batch, -1, tokens, head_dim)
    logits = torch.matmul(queries.float(), shared.float().transpose(2, 3)) * scale
    future = torch.ones(window, tokens, dtype=torch.bool, device=keys.device).triu(tokens - window + 1)
    return logits.masked_fill(future, float("-inf")).softmax(dim=-1)
