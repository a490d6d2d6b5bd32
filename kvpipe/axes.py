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

kvpipe therefore builds its own layers (kvpipe/quant_layers.py): QuantoKVLayer pads tokens so axis -1 is
per-channel of one head at any length; HQQKVLayer makes axis 0 per-channel of one head (transpose + pad) and
keeps axis 1 per-token. The numbers below are those layers' numbers, which match the stock ones wherever the
stock ones are clean.
"""

from __future__ import annotations

from typing import Optional

from kvpipe.errors import ConfigError, choices

VALID_AXES = {"quanto": (0, -1), "hqq": (0, 1)}
LAYOUTS = ("per_token", "per_channel", "kivi")  # kivi: keys per-channel, values per-token

AXIS_NUMBERS: dict[str, dict[str, tuple[Optional[int], Optional[int]]]] = {
    "quanto": {"per_token": (0, 0), "per_channel": (-1, -1), "kivi": (-1, 0)},
    # Axis 0 is per-channel through kvpipe's HQQKVLayer; stock hqq axis 0 is strided (see above).
    "hqq": {"per_token": (1, 1), "per_channel": (0, 0), "kivi": (0, 1)},
}



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
    return (key if key_override is None else key_override), (value if value_override is None else value_override)
