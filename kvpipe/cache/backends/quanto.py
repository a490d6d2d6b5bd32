"""backend=quanto: optimum-quanto, nbits 2 or 4, through kvpipe's QuantoKVLayer.

Which raw axis gives which grouping. transformers' QuantizedLayer hands `_quantize` a contiguous
[batch, heads, seq, head_dim] tensor. Let G = q_group_size and T = batch*heads*seq (the rows of the
flattened (batch, head, token) index). optimum.quanto.tensor.grouped.group (used by MaxOptimizer
and quantize_affine) ignores the 4-D shape and groups in flat memory order:
  axis 0   reshape(-1, G): a group is G consecutive elements, i.e. G consecutive channels of one token.
           Per-token iff head_dim % G == 0 (head_dim < G: a group spans G/head_dim tokens).
           ValueError "Group size (G) must be a divisor of (heads*seq*head_dim)" unless that divides.
  axis -1  reshape(T/G, G, head_dim).permute(1, 2, 0): a group is one channel over G consecutive rows of T.
           Per-channel (one head, consecutive tokens) iff seq % G == 0; otherwise groups straddle heads
           and batch rows. ValueError "Group size (G) must be a divisor of (T)" unless T % G == 0.
QuantoKVLayer pads tokens (repeating the last one) so that axis -1 is per-channel of one head at any
length. tests/test_axis_semantics.py proves each line on the real layers.
"""

from __future__ import annotations

from kvpipe.cache.backends.base import GroupedBackend


class Quanto(GroupedBackend):
    name = "quanto"
    order = 10
    nbits_choices = (2, 4)  # what QuantoQuantizedLayer accepts
    plan_nbits = (4, 2)
    axes = {"per_token": (0, 0), "per_channel": (-1, -1), "kivi": (-1, 0)}
    axes_grouping = {0: "token", -1: "channel"}

    @classmethod
    def layer_class(cls):
        from kvpipe.cache.backends._layers import QuantoKVLayer

        return QuantoKVLayer

    @classmethod
    def sliding_layer_class(cls):
        from kvpipe.cache.backends._layers import SlidingQuantoKVLayer

        return SlidingQuantoKVLayer

    def data_bytes(self, groups: int, grouping: str) -> int:
        if grouping == "channel":  # quanto packs the rows of its (group, groups) view
            return -(-self.settings.q_group_size // (8 // self.settings.nbits)) * groups
        return super().data_bytes(groups, grouping)
