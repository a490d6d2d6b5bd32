"""KV bytes: what a real cache holds (walking its layers' tensors) and the shapes predictions use.

Strategies and backends predict their own bytes from a KvShape; `kv_cache_bytes` measures a built
cache, and tests/test_capacity.py holds the two equal. Pure Python at import.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvpipe.units import DTYPE_BYTES

# Where transformers' cache layers keep key/value data: dense or residual states, and quantized states.
KV_ATTRIBUTES = ("keys", "values", "_quantized_keys", "_quantized_values")


@dataclass(frozen=True)
class KvShape:
    """What the KV cache's bytes depend on."""

    layers: int
    kv_heads: int
    head_dim: int
    batch_size: int
    dtype_bytes: int

    @property
    def elements_per_token(self) -> int:
        """K (or V) elements one token adds to one layer, across the batch."""
        return self.batch_size * self.kv_heads * self.head_dim


def kv_shape(shape, batch_size: int, dtype: str) -> KvShape:
    """From the model's ModelShape, the workload's batch and the resolved model dtype."""
    return KvShape(shape.num_layers, shape.num_kv_heads, shape.head_dim, batch_size, DTYPE_BYTES[dtype])


def dense_bytes(kv: KvShape, tokens: int) -> int:
    """DynamicLayer/StaticLayer: keys and values, [batch, kv_heads, tokens, head_dim] each."""
    return 2 * kv.layers * tokens * kv.elements_per_token * kv.dtype_bytes


def dense_fp16_bytes(shape, tokens: int, batch_size: int) -> int:
    """What a dense 16-bit cache holds for these tokens: the reference for kv_compression."""
    return dense_bytes(kv_shape(shape, batch_size, "float16"), tokens)


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
