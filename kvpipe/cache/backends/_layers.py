"""Quantized cache layers that group as their axis names say, for every sequence length. This
module imports torch: the backends load it only when a cache is built.

The stock transformers layers group the flattened [batch, heads, seq, head_dim] tensor in
memory order (proof in the docstrings of quanto.py and hqq.py beside this file, checked by
tests/test_axis_semantics.py). That breaks two ways:
  * quanto axis -1 (per-channel) raises unless batch*heads*seq is a multiple of the group size,
    and its groups straddle heads when seq is not;
  * hqq axis 0 groups a channel strided across all heads and batch rows; hqq axis 1 fails at
    bit packing for odd row counts, and at 3 bits for every 4-D tensor.
Both fixes pad the sequence by repeating its last token, which leaves every group's min and max
unchanged, and cut the padding off again on dequantize. The padding is real storage, so
kv_cache_bytes counts it.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache, HQQQuantizedLayer, QuantizedCache, QuantoQuantizedLayer

# hqq packs 8 // nbits rows into one byte: 8 padded tokens fit every bit width.
HQQ_TOKEN_MULTIPLE = 8


def pad_tokens(tensor: torch.Tensor, multiple: int, dim: int = -2) -> torch.Tensor:
    """Pad `dim` up to a multiple by repeating its last slice."""
    pad = (-tensor.shape[dim]) % multiple
    if not pad:
        return tensor
    last = tensor.narrow(dim, tensor.shape[dim] - 1, 1)
    return torch.cat(
        [tensor, last.expand(*[pad if d == dim % tensor.dim() else -1 for d in range(tensor.dim())])], dim=dim
    )


class QuantoKVLayer(QuantoQuantizedLayer):
    """Axis -1 groups q_group_size consecutive tokens of one channel of one head, at any length."""

    def _quantize(self, tensor, axis):
        if axis != -1:
            return super()._quantize(tensor, axis)
        return super()._quantize(pad_tokens(tensor, self.q_group_size).contiguous(), axis), tensor.shape[-2]

    def _dequantize(self, qtensor):
        if isinstance(qtensor, tuple):
            qtensor, tokens = qtensor
            return qtensor.dequantize()[..., :tokens, :]
        return qtensor.dequantize()


class HQQKVLayer(HQQQuantizedLayer):
    """Axis 0: q_group_size consecutive tokens of one channel of one head. Axis 1: q_group_size
    consecutive channels of one token. Quantizes a 2-D view, which also makes 3-bit work."""

    def _quantize(self, tensor, axis):
        tokens = tensor.shape[-2]
        if axis == 0:
            grouped = pad_tokens(tensor, self.q_group_size).transpose(2, 3)  # a channel's tokens now adjacent
        else:
            grouped = pad_tokens(tensor, HQQ_TOKEN_MULTIPLE)
        qtensor, meta = super()._quantize(grouped.reshape(-1, self.q_group_size).contiguous(), 1)
        meta["kv_layout"] = (axis, tuple(grouped.shape), tokens)
        return qtensor, meta

    def _dequantize(self, qtensor):
        axis, shape, tokens = qtensor[1]["kv_layout"]
        out = super()._dequantize(qtensor).reshape(shape)
        if axis == 0:
            out = out.transpose(2, 3)
        return out[..., :tokens, :].contiguous()


class SlidingQuantized:
    """A quantized layer that keeps a sliding window: transformers' QuantizedLayer schedule (the prompt
    quantized at once, a residual re-quantized every residual_length tokens), but what it keeps and
    quantizes is the last window - 1 tokens, as DynamicSlidingWindowLayer keeps. transformers'
    QuantizedCache refuses sliding layers; this is kvpipe's own. Mixed in before a backend's layer."""

    is_sliding = True

    def __init__(self, sliding_window: int, **options):
        super().__init__(**options)
        self.sliding_window = sliding_window

    def update(self, key_states, value_states, *args, **kwargs):
        kept = self.sliding_window - 1
        seen, self.cumulative_length = self.cumulative_length, self.cumulative_length + key_states.shape[-2]
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
            self._quantized_keys = self._quantize(last(key_states, kept).contiguous(), axis=self.axis_key)
            self._quantized_values = self._quantize(last(value_states, kept).contiguous(), axis=self.axis_value)
            return key_states, value_states
        # What attention sees: the last min(seen, window - 1) tokens, then the new ones (get_mask_sizes)
        visible = min(seen, kept) + key_states.shape[-2]
        keys = last(torch.cat([self._dequantize(self._quantized_keys), self.keys, key_states], dim=-2), visible)
        values = last(torch.cat([self._dequantize(self._quantized_values), self.values, value_states], dim=-2), visible)
        residual = self.keys.shape[-2] if self.keys.dim() == 4 else 0
        if residual + key_states.shape[-2] >= self.residual_length:
            self._quantized_keys = self._quantize(last(keys, kept).contiguous(), axis=self.axis_key)
            self._quantized_values = self._quantize(last(values, kept).contiguous(), axis=self.axis_value)
            self.keys = torch.tensor([], dtype=key_states.dtype, device=key_states.device)
            self.values = torch.tensor([], dtype=key_states.dtype, device=key_states.device)
        else:
            self.keys = torch.cat([self.keys, key_states], dim=-2)
            self.values = torch.cat([self.values, value_states], dim=-2)
        return keys, values

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        """As DynamicSlidingWindowLayer: the window's offset and the visible length."""
        seen = self.cumulative_length
        offset = max(seen - self.sliding_window + 1, 0)
        length = self.sliding_window - 1 + query_length if seen >= self.sliding_window else seen + query_length
        return length, offset

    def get_max_length(self) -> int:
        return self.sliding_window


def last(tensor: torch.Tensor, tokens: int) -> torch.Tensor:
    """The last `tokens` of the sequence axis (all of it when shorter)."""
    return tensor.narrow(-2, max(tensor.shape[-2] - tokens, 0), min(tokens, tensor.shape[-2]))


class SlidingQuantoKVLayer(SlidingQuantized, QuantoKVLayer):
    """quanto, keeping a sliding window."""


class SlidingHQQKVLayer(SlidingQuantized, HQQKVLayer):
    """hqq, keeping a sliding window."""


class LayeredQuantizedCache(QuantizedCache):
    """A QuantizedCache of the layers kvpipe chose, one per decoder layer. transformers' own builds
    one layer class for every layer and raises for any layer that is not full attention."""

    def __init__(self, layers: list):
        Cache.__init__(self, layers=layers)
