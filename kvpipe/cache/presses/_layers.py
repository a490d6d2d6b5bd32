"""A press on a built cache: each full-attention layer's update evicts (the layer stays transformers'
DynamicLayer, or a quantized layer), so what is stored, counted and masked is the layer's own. This
module imports torch: a strategy loads it only when a cache is built.

At prefill the layer's first update gets the whole prompt, and attention reads all of it. Then a
forward hook on the layer's attention module hands the press what that module received and computed
(its hidden states and rotary embeddings, and its attention weights where the implementation returns
them), and the layer stores the tokens the press keeps (then quantizes them, for a quantized layer).
The hook removes itself after that one forward, so decoding, and every job without a press, pays
nothing for it. From then on the layer grows as before; positions stay the prompt's own (generate
counts them from the attention mask, not from the shorter cache), and the causal mask spans what
the layer holds.
"""

from __future__ import annotations

import types

import torch


def evicting_update(layer, key_states, value_states, *args, **kwargs):
    """The layer's own update, with its press: bound to the layer in place of its class's method (see
    `attach`), so the layer stays of its own class."""
    if layer.is_initialized:
        keys, values = type(layer).update(layer, key_states, value_states, *args, **kwargs)
        if layer.press.rolls:
            layer.press.trim(layer, layer.prompt_tokens)
        return keys, values
    layer.prompt = key_states, value_states, args, kwargs  # stored by `store_what_the_press_keeps`
    return key_states, value_states  # the prompt's own attention reads every token


def store_what_the_press_keeps(layer, module, hidden_states, position_embeddings, attentions) -> None:
    """After the prompt's attention: the layer's own update, with the tokens its press keeps."""
    keys, values, args, kwargs = layer.prompt
    layer.prompt, layer.prompt_tokens = None, keys.shape[-2]
    index = layer.press.keep(module, hidden_states, keys, values, attentions, position_embeddings)
    gathered = index.unsqueeze(-1).expand(-1, -1, -1, keys.shape[-1])
    type(layer).update(layer, keys.gather(2, gathered), values.gather(2, gathered), *args, **kwargs)


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
        if index not in modules:
            raise RuntimeError(f"layer {index} of {type(model).__name__} has no attention module a press can read")
        layer.press, layer.prompt = press, None
        layer.update = types.MethodType(evicting_update, layer)
        _after_prefill(layer, modules[index], cache)
    return cache


def _after_prefill(layer, module, cache) -> None:
    """Once the module's first forward through `cache` has run, the layer stores what its press keeps."""

    def hook(module, args, kwargs, output):
        if kwargs.get("cache", kwargs.get("past_key_values")) is not cache:
            return
        handle.remove()
        if layer.prompt is not None:
            attentions = output[1] if isinstance(output, tuple) and len(output) > 1 else None
            hidden_states = kwargs.get("hidden_states", args[0] if args else None)
            store_what_the_press_keeps(layer, module, hidden_states, kwargs.get("position_embeddings"), attentions)

    handle = module.register_forward_hook(hook, with_kwargs=True)
