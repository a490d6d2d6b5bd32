"""backend=hqq: HQQ, nbits 1, 2, 3, 4 or 8, through kvpipe's HQQKVLayer.

Which raw axis gives which grouping. hqq.core.quantize.Quantizer.quantize takes min/max over `axis`
of the tensor reshaped in flat memory order (G = q_group_size, N = numel, T = batch*heads*seq):
  axis 1   reshape(-1, G): G consecutive channels of one token; per-token iff head_dim % G == 0. Bit
           packing (hqq.core.bitpack) splits the N/G group rows into 8/nbits slices, so nbits 4 needs
           N/G even and nbits 2 needs N/G % 4 == 0, else RuntimeError (e.g. an odd prompt with 1 or 3
           KV heads, head_dim == G); nbits 3 fails on 4-D tensors (Quantizer.dequantize slices
           shape[0]*shape[1]//G rows).
  axis 0   reshape(G, -1): a group is G elements N/G apart in memory: one channel (iff T % G == 0, else
           channels mix) sampled every T/G-th row of T, i.e. strided across ALL heads and batch rows, so
           one sequence's error depends on its batch neighbours.
  Both axes: AssertionError "group_size should be divisble by the total tensor dimensions" if N % G.
HQQKVLayer makes axis 0 per-channel of one head (transpose + pad) and keeps axis 1 per-token (padded
to 8 tokens for bit packing). tests/test_axis_semantics.py proves each line on the real layers.
"""

from __future__ import annotations

from kvpipe.cache.backends.grouped import GroupedBackend


class HQQ(GroupedBackend):
    name = "hqq"
    order = 20
    nbits_choices = (1, 2, 3, 4, 8)  # what HQQQuantizedLayer accepts
    plan_nbits = (4, 2)
    axes = {"per_token": (1, 1), "per_channel": (0, 0), "kivi": (0, 1)}
    axes_grouping = {1: "token", 0: "channel"}
    token_multiple = 8  # = _layers.HQQ_TOKEN_MULTIPLE (that module imports torch; a test keeps them equal)

    @classmethod
    def layer_class(cls):
        from kvpipe.cache.backends._layers import HQQKVLayer

        return HQQKVLayer

    def quality_batching(self) -> str:
        """Apart: hqq's proximal optimiser stops on the error of the whole tensor it is given, so rows
        quantized together come out (slightly) different from rows quantized alone."""
        return "apart"

    @classmethod
    def sliding_layer_class(cls):
        from kvpipe.cache.backends._layers import SlidingHQQKVLayer

        return SlidingHQQKVLayer

    def data_bytes(self, groups: int, grouping: str) -> int:
        if self.settings.nbits == 3:  # 10 three-bit values per int32, rows padded to 10
            return -(-groups // 10) * self.settings.q_group_size * 4
        return super().data_bytes(groups, grouping)

    def bits_per_value(self) -> float:
        return 3.2 if self.settings.nbits == 3 else self.settings.nbits  # 3 bits: 10 values per int32
