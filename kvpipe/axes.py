"""Which raw axis number gives which KV-cache grouping, per quantization backend.

transformers' QuantizedLayer hands `_quantize` a contiguous [batch, heads, seq, head_dim] tensor. Let
N = numel, G = q_group_size, T = batch*heads*seq (rows of the flattened (batch, head, token) index).
Neither backend looks at the 4-D shape: both group the tensor in flat memory order (tests/test_axis_semantics.py
proves each line below on the real QuantoQuantizedLayer / HQQQuantizedLayer).

quanto, optimum.quanto.tensor.grouped.group (used by MaxOptimizer and quantize_affine):
  axis 0   reshape(-1, G): a group is G consecutive elements, i.e. G consecutive channels of one token.
           Per-token iff head_dim % G == 0 (head_dim < G: a group spans G/head_dim tokens).
           ValueError "Group size (G) must be a divisor of (heads*seq*head_dim)" unless that divides.
  axis -1  reshape(T/G, G, head_dim).permute(1, 2, 0): a group is one channel over G consecutive rows of T.
           Per-channel (one head, consecutive tokens) iff seq % G == 0; otherwise groups straddle heads
           and batch rows. ValueError "Group size (G) must be a divisor of (T)" unless T % G == 0.
hqq, hqq.core.quantize.Quantizer.quantize (min/max over `axis` of the reshaped tensor):
  axis 1   reshape(-1, G): same groups as quanto axis 0, per-token iff head_dim % G == 0. Bit packing
           (hqq.core.bitpack) splits the N/G group rows into 8/nbits slices, so nbits 4 needs N/G even and
           nbits 2 needs N/G % 4 == 0, else RuntimeError (e.g. an odd prompt with 1 or 3 KV heads, head_dim == G);
           nbits 3 fails on 4-D tensors (Quantizer.dequantize slices shape[0]*shape[1]//G rows).
  axis 0   reshape(G, -1): a group is G elements N/G apart in memory: one channel (iff T % G == 0, else
           channels mix) sampled every T/G-th row of T, i.e. strided across ALL heads and batch rows, so one
           sequence's error depends on its batch neighbours. Within one head only if batch*heads == 1
           (and consecutive only if also seq == G): mapped to None.
  Both axes: AssertionError "group_size should be divisble by the total tensor dimensions. ..." if N % G.

HQQChannelwiseLayer (below) is the fix: axis 0 transposes to [batch, heads, head_dim, seq], pads seq to a
multiple of G by repeating the last token, and quantizes G consecutive tokens of one channel of one head.
"""

from __future__ import annotations

import functools
from typing import Optional

from kvpipe.errors import ConfigError, choices

VALID_AXES = {"quanto": (0, -1), "hqq": (0, 1)}
LAYOUTS = ("per_token", "per_channel", "kivi")  # kivi: keys per-channel, values per-token

AXIS_NUMBERS: dict[str, dict[str, tuple[Optional[int], Optional[int]]]] = {
    "quanto": {"per_token": (0, 0), "per_channel": (-1, -1), "kivi": (-1, 0)},
    # None: hqq has no axis number that groups one channel of one head (see axis 0 above).
    "hqq": {"per_token": (1, 1), "per_channel": (None, None), "kivi": (None, 1)},
}

_NO_HQQ_CHANNEL = ("hqq has no per-channel axis: its axis 0 groups a channel strided across all heads and "
                   "batch rows; use axis.layout=per_token, backend=quanto, or set axis.key/axis.value=0 explicitly")


def backend_axes(backend: str, layout: str, key_override: Optional[int] = None,
                 value_override: Optional[int] = None) -> tuple[int, int]:
    """(axis_key, axis_value) for QuantizedCache; an override replaces the layout's number for its side."""
    if backend not in AXIS_NUMBERS:
        raise ConfigError("backend.name", backend, choices(AXIS_NUMBERS))
    if layout not in LAYOUTS:
        raise ConfigError("axis.layout", layout, choices(LAYOUTS))
    for field, value in (("axis.key", key_override), ("axis.value", value_override)):
        if value is not None and value not in VALID_AXES[backend]:
            raise ConfigError(field, value, choices(VALID_AXES[backend]))
    key, value = AXIS_NUMBERS[backend][layout]
    key = key if key_override is None else key_override
    value = value if value_override is None else value_override
    if key is None or value is None:
        raise ConfigError("axis.layout", layout, _NO_HQQ_CHANNEL)
    return key, value


def quantizable(backend: str, axis: int, shape: tuple[int, int, int, int], group_size: int, nbits: int) -> bool:
    """True iff the raw backend layer can quantize and dequantize a [batch, heads, seq, head_dim] tensor."""
    batch, heads, seq, head_dim = shape
    n = batch * heads * seq * head_dim
    if backend == "quanto":
        per_feature = n // head_dim if axis == -1 else n // batch  # numel per index of the kept axis
        return group_size <= per_feature and per_feature % group_size == 0
    if n % group_size:
        return False
    if nbits == 3:  # hqq's 3-bit dequantize slices shape[0] * shape[1] // G rows: wrong for 4-D on axis 1
        return axis == 0
    packed_rows = n // group_size if axis == 1 else group_size  # packing splits rows into 8 // nbits slices
    return nbits == 8 or packed_rows % (8 // nbits) == 0


@functools.lru_cache(maxsize=None)
def hqq_channelwise_layer():
    """HQQQuantizedLayer whose axis 0 is truly per-channel (axis 1 is unchanged, per-token).

    Use with (axis_key, axis_value) = (0, 0) for per_channel or (0, 1) for kivi, in place of the layers
    QuantizedCache(backend="hqq") builds. Defined lazily so that this module does not import torch.
    """
    import torch
    from transformers.cache_utils import HQQQuantizedLayer

    class HQQChannelwiseLayer(HQQQuantizedLayer):
        def _quantize(self, tensor, axis):
            if axis != 0:
                return super()._quantize(tensor, axis)
            b, h, s, d = tensor.shape
            g, pad = self.q_group_size, (-tensor.shape[2]) % self.q_group_size
            t = tensor.transpose(2, 3)  # [b, h, d, s]: a channel's tokens are now consecutive
            if pad:  # repeat the last token, which keeps every group's min and max
                t = torch.cat([t, t[..., -1:].expand(b, h, d, pad)], dim=-1)
            # 2-D [b*h*d*(s+pad)/g, g]: row count is a multiple of head_dim, so bit packing fits
            qtensor, meta = super()._quantize(t.reshape(-1, g).contiguous(), 1)
            meta["kv_shape"] = (b, h, d, s + pad, s)
            return qtensor, meta

        def _dequantize(self, qtensor):
            out = super()._dequantize(qtensor)
            if "kv_shape" not in qtensor[1]:
                return out
            b, h, d, padded, s = qtensor[1]["kv_shape"]
            return out.reshape(b, h, d, padded)[..., :s].transpose(2, 3).contiguous()

    return HQQChannelwiseLayer
