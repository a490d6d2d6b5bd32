"""KV bytes: what a real cache holds (walking its layers' tensors) and the shapes predictions use.

Strategies and backends predict their own bytes from a KvShape; `kv_cache_bytes` measures a built
cache, and tests/test_capacity.py holds the two equal. Pure Python at import.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Optional

from kvpipe.errors import KvpipeError
from kvpipe.units import DTYPE_BYTES

# transformers' layer types whose cache keeps the last `window` tokens (chunked attention caches as
# sliding does; only its mask differs), and the types that keep no KV of their own
WINDOWED_TYPES = ("sliding_attention", "chunked_attention")
NO_KV_TYPES = ("dummy",)  # KV shared with another layer, or a layer without attention (moe, mlp)

# Where transformers' cache layers keep key/value data: dense or residual states, and quantized states.
KV_ATTRIBUTES = ("keys", "values", "_quantized_keys", "_quantized_values")


@dataclass(frozen=True)
class KvShape:
    """What the KV cache's bytes depend on: per layer that holds KV, its window (None: full
    attention, the whole sequence), and the K/V heads, head size, batch and dtype all layers share."""

    windows: tuple[Optional[int], ...]
    kv_heads: int
    head_dim: int
    batch_size: int
    dtype_bytes: int

    @property
    def layers(self) -> int:
        return len(self.windows)

    @property
    def full_layers(self) -> int:
        return sum(window is None for window in self.windows)

    @property
    def sliding_windows(self) -> tuple[int, ...]:
        return tuple(window for window in self.windows if window is not None)

    @property
    def elements_per_token(self) -> int:
        """K (or V) elements one token adds to one layer, across the batch."""
        return self.batch_size * self.kv_heads * self.head_dim

    def token_bytes(self) -> int:
        """Keys and values one token adds to one dense layer, in the model dtype."""
        return 2 * self.elements_per_token * self.dtype_bytes

    def with_layers(self, windows) -> KvShape:
        return replace(self, windows=tuple(windows))


class UnpredictableLayers(KvpipeError):
    """A model with layer types whose cache kvpipe cannot count (linear attention, say)."""


def kv_shape(shape, batch_size: int, dtype: str) -> KvShape:
    """From the model's ModelShape, the workload's batch and the resolved model dtype. Layers that keep
    no KV (shared with another layer) are left out; a layer type kvpipe cannot count is one line."""
    unknown = sorted({layer.attention for layer in shape.layers} - {"full_attention", *WINDOWED_TYPES, *NO_KV_TYPES})
    if unknown:
        raise UnpredictableLayers(
            f"the model has {', '.join(unknown)} layers; kvpipe predicts the caches of "
            f"full_attention, {', '.join(WINDOWED_TYPES)} and {', '.join(NO_KV_TYPES)} layers only"
        )
    windows = tuple(layer.window for layer in shape.layers if layer.attention not in NO_KV_TYPES)
    return KvShape(windows, shape.num_kv_heads, shape.head_dim, batch_size, DTYPE_BYTES[dtype])


def dynamic_layer_tokens(window: Optional[int], prompt_tokens: int, new_tokens: int) -> int:
    """Tokens whose storage one DynamicLayer (window None) or DynamicSlidingWindowLayer holds once
    new_tokens follow the prompt. A sliding layer keeps a view of its last window - 1 tokens, and a
    view pins the tensor it was cut from: the whole prompt after prefill (new_tokens=1), and from
    the first decode step on, the window - 1 kept tokens concatenated with the new one."""
    steps = new_tokens - 1  # the last generated token is never fed back
    if window is None:
        return prompt_tokens + steps
    return prompt_tokens if steps == 0 else min(prompt_tokens + steps, window)


def static_layer_tokens(window: Optional[int], max_cache_len: int) -> int:
    """A StaticLayer allocates max_cache_len tokens; a StaticSlidingWindowLayer no more than its window."""
    return max_cache_len if window is None else min(window, max_cache_len)


def dynamic_bytes(kv: KvShape, prompt_tokens: int, new_tokens: int, full_layer_tokens: list[int] | None = None) -> int:
    """DynamicCache: keys and values, [batch, kv_heads, tokens, head_dim] each, layer by layer;
    `full_layer_tokens`: what each layer holds, by index, where it is full-attention and a press
    evicted from it (a sliding layer's entry is not read)."""
    return (
        sum(
            full_layer_tokens[index]
            if w is None and full_layer_tokens is not None
            else dynamic_layer_tokens(w, prompt_tokens, new_tokens)
            for index, w in enumerate(kv.windows)
        )
        * kv.token_bytes()
    )


def static_bytes(kv: KvShape, max_cache_len: int) -> int:
    """StaticCache built for max_cache_len: each layer's whole allocation."""
    return sum(static_layer_tokens(w, max_cache_len) for w in kv.windows) * kv.token_bytes()


def dense_bytes(kv: KvShape, tokens: int) -> int:
    """Every layer holding `tokens` dense (a full-attention model's DynamicLayer/StaticLayer)."""
    return kv.layers * tokens * kv.token_bytes()


def window_bytes(kv: KvShape) -> int:
    """What the sliding layers of a dense cache hold once past their windows: a fixed cost."""
    return sum(kv.sliding_windows) * kv.token_bytes()


def dense_fp16_bytes(shape, prompt_tokens: int, new_tokens: int, batch_size: int) -> int:
    """What a 16-bit DynamicCache holds for the same job (each sliding layer at its window): the
    reference for kv_compression."""
    return dynamic_bytes(kv_shape(shape, batch_size, "float16"), prompt_tokens, new_tokens)


def kv_cache_bytes(cache) -> int:
    """Bytes the cache actually holds, found by walking its layers' tensors.

    Dense layers count keys and values (a static layer's whole allocation); quantized layers
    count the packed integers, scales and zero points, and the full-precision residual.
    Each storage is counted once, even when several views share it. Bookkeeping tensors
    (a static layer's position counter) are not KV data and are left out.
    """
    return _walk(cache, lambda tensor: True)


def kv_cache_host_bytes(cache) -> int:
    """The part of kv_cache_bytes held in host memory (an offloaded cache's other layers)."""
    return _walk(cache, lambda tensor: tensor.device.type == "cpu")


def _walk(cache, counted) -> int:
    seen: set[tuple[int, int]] = set()
    return sum(
        _tensor_bytes(getattr(layer, name, None), seen, counted) for layer in cache.layers for name in KV_ATTRIBUTES
    )


def _tensor_bytes(obj, seen: set, counted) -> int:
    import torch

    if isinstance(obj, torch.Tensor):
        if hasattr(obj, "__tensor_flatten__"):  # quanto's QTensor: packed data, scale, shift
            names, _ = obj.__tensor_flatten__()
            return sum(_tensor_bytes(getattr(obj, name), seen, counted) for name in names)
        storage = obj.untyped_storage()
        key = (storage.data_ptr(), storage.nbytes())
        if obj.numel() == 0 or key in seen or not counted(obj):
            return 0
        seen.add(key)
        return storage.nbytes()
    if isinstance(obj, dict):
        return sum(_tensor_bytes(value, seen, counted) for value in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(_tensor_bytes(value, seen, counted) for value in obj)
    return 0


def cached_tokens(cache) -> int:
    """Tokens held per sequence (the cumulative length for quantized layers)."""
    return int(cache.get_seq_length())
