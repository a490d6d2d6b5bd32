"""A press on a built cache: each full-attention layer's update evicts (the layer stays transformers'
DynamicLayer, or a quantized layer), so what is stored, counted and masked is the layer's own. This module imports torch: a strategy loads it only when a cache is built.

At prefill the layer's first update gets the whole prompt: attention reads all of it, the layer
stores the tokens the press keeps (then quantizes them, for a quantized layer). From then on it
grows as before; positions stay the prompt's own (generate counts them from the attention mask,
not from the shorter cache), and the causal mask spans what the layer holds.

SnapKV scores with the prompt's last queries, which the layer's update never sees: a hook on the
attention module computes them from the same hidden states and rotary embeddings the module uses,
hands them to the layer, and removes itself once the layer has read the prompt.
"""

from __future__ import annotations

import types

import torch


def evicting_update(layer, key_states, value_states, *args, **kwargs):
    """The layer's own update, with its press: bound to the layer in place of its class's method (see
    `attach`), so the layer stays of its own class."""
    own = type(layer).update
    press = layer.press
    if layer.is_initialized:
        keys, values = own(layer, key_states, value_states, *args, **kwargs)
        if press.bounds:
            press.trim(layer, layer.prompt_tokens)
        return keys, values
    layer.prompt_tokens = key_states.shape[-2]
    index = press.keep(key_states, value_states, layer.queries, layer.module)
    layer.queries = None
    gathered = index.unsqueeze(-1).expand(-1, -1, -1, key_states.shape[-1])
    own(layer, key_states.gather(2, gathered), value_states.gather(2, gathered), *args, **kwargs)
    return key_states, value_states  # the prompt's own attention reads every token


def attention_modules(model) -> dict[int, torch.nn.Module]:
    """Each decoder layer's attention module, by layer index."""
    return {
        module.layer_idx: module
        for module in model.modules()
        if type(module).__name__.endswith("Attention") and isinstance(getattr(module, "layer_idx", None), int)
    }


def attach(press, cache, model):
    """`cache` with every full-attention layer evicting as `press` says; returns the cache."""
    modules = attention_modules(model)
    for index, layer in enumerate(cache.layers):
        if getattr(layer, "is_sliding", False) or type(layer).__name__ == "DummyLayer":
            continue
        layer.press, layer.module, layer.queries = press, modules.get(index), None
        layer.update = types.MethodType(evicting_update, layer)
        if press.needs_queries:
            _observe(layer, modules[index], cache, press.window)
    return cache


def _observe(layer, module, cache, window: int) -> None:
    """Until the layer has read its prompt, hand it the prompt's last `window` queries."""

    def hook(module, args, kwargs):
        if (kwargs.get("cache") or kwargs.get("past_key_values")) is not cache:
            return
        if not layer.is_initialized:
            layer.queries = window_queries(module, kwargs["hidden_states"], kwargs["position_embeddings"], window)
        handle.remove()

    handle = module.register_forward_pre_hook(hook, with_kwargs=True)


def window_queries(module, hidden_states, position_embeddings, window: int):
    """The attention's own queries [batch, heads, window, head_dim] of the last `window` tokens:
    q_proj, q_norm where the model has one, then its rotary embeddings."""
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    batch = hidden_states.shape[0]
    last = hidden_states[:, -window:]
    queries = module.q_proj(last).view(batch, last.shape[1], -1, module.head_dim).transpose(1, 2)
    if hasattr(module, "q_norm"):
        queries = module.q_norm(queries)
    cos, sin = position_embeddings
    queries, _ = apply_rotary_pos_emb(queries, queries, cos[:, -window:], sin[:, -window:])
    return queries
