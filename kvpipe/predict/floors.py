"""The floors of `kvpipe plan --hardware`: the least time a decode step and a prefill can take on an
accelerator, from the bytes they must move and the FLOPs they must compute.

Per strategy and context (prompt + new tokens, as plan counts it):
- A decode step reads the weights (`weights_read_bytes_per_step`, as runs count it: every weight,
  untied input embeddings a row per sequence) and the KV cache (`kv_read_bytes_per_step`: the
  strategy's own decode_kv_traffic_bytes, which counts a quantized layer's dequantized copy written
  and read back, a static cache's whole allocation, and each sliding layer at its window). Their sum
  over the memory bandwidth is the TPOT floor. Decode at these batch sizes does a few FLOPs a byte,
  far below any accelerator's ridge point, so its FLOPs are not what bounds it.
- A prefill computes kvpipe.model.compute.prefill_flops, reads every weight once and writes the
  prompt's KV. The larger of FLOPs over the peak dense throughput and bytes over the bandwidth is the
  TTFT floor.
- Offloading caches on CUDA move layers between host and device every step, at the interconnect's
  speed: no TPOT floor, and the strategy's traffic_unknown_reason says why (runs say the same).

What a job needs in memory: the weights, the cache, and the larger of two transients that never
coexist: the prefill's largest activation (kvpipe.model.compute) and, for a quantized cache, the one
layer a decode step dequantizes. Both are stated beside the total.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvpipe.cache.accounting import KvShape, kv_shape
from kvpipe.measure.roofline import weights_read_bytes
from kvpipe.model import compute
from kvpipe.units import DTYPE_BYTES


@dataclass(frozen=True)
class Cost:
    """One strategy's job at one context: the bytes and FLOPs its floors and fits are made of."""

    prompt_tokens: int
    new_tokens: int
    weights_bytes: int
    kv_cache_bytes: int  # on the device (an offloading cache: the layers it keeps there)
    weights_read_bytes_per_step: int
    kv_read_bytes_per_step: int | None  # None: host <-> device traffic, not memory bandwidth
    prefill_flops: int
    prefill_attention_flops: int  # of prefill_flops: attention's products (the rest: the weights')
    prefill_bytes: int
    activation_bytes: int  # the prefill's largest activation
    dequantized_copy_bytes: int  # the largest layer a decode step dequantizes (quantized caches)

    @property
    def context(self) -> int:
        return self.prompt_tokens + self.new_tokens

    @property
    def decode_bytes_per_step(self) -> int | None:
        if self.kv_read_bytes_per_step is None:
            return None
        return self.weights_read_bytes_per_step + self.kv_read_bytes_per_step

    @property
    def memory_bytes(self) -> int:
        """Weights + KV cache + the larger transient (the prefill's activation, or the dequantized copy)."""
        return self.weights_bytes + self.kv_cache_bytes + max(self.activation_bytes, self.dequantized_copy_bytes)

    def tpot_floor_ms(self, hardware) -> float | None:
        decode = self.decode_bytes_per_step
        return None if decode is None else decode / hardware.memory_bandwidth_bytes_per_s * 1e3

    def ttft_floor_ms(self, hardware, dtype: str) -> float:
        compute_s = self.prefill_flops / hardware.peak_flops(dtype)
        return max(compute_s, self.prefill_bytes / hardware.memory_bandwidth_bytes_per_s) * 1e3

    def prefill_bound(self, hardware, dtype: str) -> str:
        """Which term sets the TTFT floor: 'compute' or 'memory'."""
        compute_s = self.prefill_flops / hardware.peak_flops(dtype)
        return "compute" if compute_s >= self.prefill_bytes / hardware.memory_bandwidth_bytes_per_s else "memory"


class ModelCosts:
    """One model in one dtype, batch size and device: the Cost of any strategy at any context."""

    def __init__(self, shape, dims: compute.Dimensions, weights_bytes: int, dtype: str, batch_size: int, device: str):
        self.shape, self.dims, self.weights_bytes, self.dtype, self.device = shape, dims, weights_bytes, dtype, device
        self.batch_size = batch_size
        self.kv: KvShape = kv_shape(shape, batch_size, dtype)
        self.dtype_bytes = DTYPE_BYTES[dtype]
        self.embedding_bytes, self.embedding_row_bytes = compute.embedding_bytes(dims, self.dtype_bytes)

    def weights_read(self, rows: int) -> int:
        """Weight bytes a forward pass over `rows` tokens reads (kvpipe.measure.roofline)."""
        return weights_read_bytes(self.weights_bytes, self.embedding_bytes, self.embedding_row_bytes, self.dims.tied,
                                  rows)  # fmt: skip

    def at(self, strategy, prompt_tokens: int, new_tokens: int) -> Cost:
        kv, batch = self.kv, self.batch_size
        on_device = strategy.device_kv_shape(kv, self.device)
        whole = strategy.predict_kv_bytes(kv, prompt_tokens, new_tokens)  # as runs count it: host and device
        return Cost(
            prompt_tokens=prompt_tokens,
            new_tokens=new_tokens,
            weights_bytes=self.weights_bytes,
            kv_cache_bytes=strategy.predict_kv_bytes(on_device, prompt_tokens, new_tokens),
            weights_read_bytes_per_step=self.weights_read(batch),
            kv_read_bytes_per_step=strategy.decode_kv_traffic_bytes(kv, whole, prompt_tokens, new_tokens, self.device),
            prefill_flops=compute.prefill_flops(self.dims, prompt_tokens, batch),
            prefill_attention_flops=compute.prefill_attention_flops(self.dims, prompt_tokens, batch),
            # every weight read once, and the prompt's keys and values written (a one-token output's cache)
            prefill_bytes=self.weights_read(batch * prompt_tokens) + strategy.predict_kv_bytes(kv, prompt_tokens, 1),
            activation_bytes=compute.largest_activation_bytes(self.dims, prompt_tokens, batch, self.dtype_bytes),
            dequantized_copy_bytes=strategy.dequantized_copy_bytes(on_device, prompt_tokens, new_tokens),
        )


def split(context: int, max_new_tokens: int) -> tuple[int, int]:
    """(prompt, new tokens) for a context, generating max_new_tokens where the context allows."""
    new_tokens = max(1, min(max_new_tokens, context - 1))
    return context - new_tokens, new_tokens


def model_costs(model_cfg, shape, weights_bytes: int, dtype: str, batch_size: int, device: str) -> ModelCosts:
    """ModelCosts from the model's config, its shape and its weight bytes in `dtype` (kvpipe.model.weights)."""
    dims = compute.dimensions(model_cfg, shape, weights_bytes, DTYPE_BYTES[dtype])
    return ModelCosts(shape, dims, weights_bytes, dtype, batch_size, device)
