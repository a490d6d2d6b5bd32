"""What quanto and hqq share: groups of values with a scale and a zero point each, a full-precision
residual re-quantized every residual_length tokens, the bytes those layers hold, and the warm-up
before anything is timed. Not a backend itself (it sets no name): quanto.py and hqq.py are."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, ClassVar, Optional

from kvpipe.cache.backends.base import QuantBackend, alternatives
from kvpipe.errors import ConfigError, KvpipeError, first_line


@dataclass
class GroupedSettings:
    nbits: int = 4
    q_group_size: int = 64  # must divide the model's head_dim
    residual_length: int = 128  # tokens kept in full precision before they are quantized


class GroupedBackend(QuantBackend):
    """quanto and hqq: groups of q_group_size values, each with a scale and a zero point, and a
    full-precision residual that is re-quantized every residual_length tokens."""

    Settings = GroupedSettings
    quantizes_windows = True
    axes_grouping: ClassVar[dict[int, str]] = {}  # raw axis -> "token" or "channel": what one group spans
    token_multiple: ClassVar[int] = 1  # the padded token count per-token groups need

    def check(self) -> None:
        super().check()
        if self.settings.q_group_size <= 0:
            raise ConfigError("backend.q_group_size", self.settings.q_group_size, "expected a positive integer")
        if self.settings.residual_length < 0:
            raise ConfigError("backend.residual_length", self.settings.residual_length, "expected 0 or more")

    def fits_head_dim(self, head_dim: int) -> bool:
        return head_dim % self.settings.q_group_size == 0

    def residual_length(self) -> int:
        return self.settings.residual_length

    @classmethod
    def search_points(cls, head_dim: int, group_sizes, residual_lengths) -> list[dict[str, str]]:
        """Each bit width and layout at every group size that divides head_dim and every residual length."""
        return [
            {**point, "backend.q_group_size": str(size), "backend.residual_length": str(residual)}
            for point in super().search_points(head_dim, group_sizes, residual_lengths)
            for size in group_sizes
            if head_dim % size == 0
            for residual in residual_lengths
        ]

    def check_for_model(self, shape) -> None:
        if not self.fits_head_dim(shape.head_dim):
            divisors = [g for g in (16, 32, 64, 128) if shape.head_dim % g == 0]
            raise ConfigError(
                "backend.q_group_size",
                self.settings.q_group_size,
                f"must divide the model's head_dim={shape.head_dim}; expected one of: {', '.join(map(str, divisors))}",
            )

    def cache_options(self) -> dict[str, Any]:
        key_axis, value_axis = self.raw_axes()
        return dict(
            nbits=self.settings.nbits,
            axis_key=key_axis,
            axis_value=value_axis,
            q_group_size=self.settings.q_group_size,
            residual_length=self.settings.residual_length,
        )

    @classmethod
    def warm(cls, device: str, dtype) -> None:
        _warm(cls, device, dtype)

    def label(self) -> str:
        return f"{self.name}:int{self.settings.nbits}:{self.axis.layout}"

    def quality_batching(self) -> str:
        """Groups never span batch rows. Per-token groups span one token's channels, so padding tokens
        form groups of their own; per-channel groups span tokens, which padding would join."""
        per_token = all(self.axes_grouping[axis] == "token" for axis in self.raw_axes())
        return "padded" if per_token else "equal_length"

    def layer_bytes(self, kv, window: Optional[int], prompt_tokens: int, new_tokens: int) -> int:
        """Packed keys and values, a scale and zero point per group, and the residual. A sliding layer
        quantizes no more than the window - 1 tokens it keeps (kvpipe's SlidingQuantized layers)."""
        quantized_tokens, residual_tokens = flush_schedule(prompt_tokens, new_tokens, self.settings.residual_length)
        if window is not None:
            quantized_tokens = min(quantized_tokens, window - 1)
        return self.held_bytes(kv, quantized_tokens, residual_tokens)

    def held_bytes(self, kv, quantized_tokens: int, residual_tokens: int) -> int:
        packed = sum(self.packed_bytes(kv, self.axes_grouping[axis], quantized_tokens) for axis in self.raw_axes())
        return packed + residual_tokens * kv.token_bytes()

    def dequantized_tokens(self, window: Optional[int], prompt_tokens: int, new_tokens: int) -> int:
        """Tokens a decode step dequantizes and concatenates with the residual, per layer."""
        quantized_tokens, residual_tokens = flush_schedule(prompt_tokens, new_tokens, self.settings.residual_length)
        return (quantized_tokens if window is None else min(quantized_tokens, window - 1)) + residual_tokens

    def window_bytes(self, kv, window: int) -> int:
        """A full window quantized and a residual one token short of flushing: the most it holds."""
        return self.held_bytes(kv, window - 1, max(self.settings.residual_length - 1, 0))

    def packed_bytes(self, kv, grouping: str, tokens: int) -> int:
        """One layer's keys (or values): data plus a scale and a zero point per group, in the model dtype.
        kvpipe's layers pad the token axis (repeating the last token): per-channel groups need whole
        groups of tokens, per-token groups `token_multiple`."""
        size = self.settings.q_group_size
        multiple = size if grouping == "channel" else self.token_multiple
        groups = -(-tokens // multiple) * multiple * kv.elements_per_token // size
        return self.data_bytes(groups, grouping) + 2 * groups * kv.dtype_bytes

    def data_bytes(self, groups: int, grouping: str) -> int:
        """The rows of a (groups, group) view, 8 // nbits to a byte."""
        return -(-groups // (8 // self.settings.nbits)) * self.settings.q_group_size

    def bits_per_value(self) -> float:
        return self.settings.nbits

    def token_bytes(self, kv) -> float:
        """Packed bits plus the token's share of scales and zero points."""
        per_value = self.bits_per_value() / 8 + 2 * kv.dtype_bytes / self.settings.q_group_size
        return 2 * kv.elements_per_token * per_value


def flush_schedule(prompt_tokens: int, new_tokens: int, residual_length: int) -> tuple[int, int]:
    """(quantized tokens, full-precision residual tokens) once new_tokens are generated.

    QuantizedLayer.update quantizes the whole prompt on the first call; each later token joins the
    residual, and the call that brings it to residual_length re-quantizes everything and empties it."""
    steps = max(new_tokens - 1, 0)  # the last generated token is never fed back
    window = max(residual_length, 1)  # 0 and 1 both flush on every step
    return prompt_tokens + steps // window * window, steps % window


@functools.lru_cache(maxsize=None)
def _warm(backend: type[GroupedBackend], device: str, dtype) -> None:
    """Quantize and dequantize once per process before anything is timed: quanto builds its C++
    extension on first use (tens of seconds), which must never land inside a measured call."""
    import torch

    layer = backend.layer_class()(nbits=4, axis_key=0, axis_value=0, q_group_size=64, residual_length=0)
    states = torch.randn(1, 1, 8, 64, device=device, dtype=dtype)
    try:
        layer.update(states, states)
        layer._dequantize(layer._quantized_keys)
    except (OSError, RuntimeError, ImportError) as exc:  # e.g. no nvcc to build quanto's CUDA extension
        raise KvpipeError(
            f"backend={backend.name} cannot run on {device}: {type(exc).__name__}: {first_line(exc)}; "
            f"try {alternatives(backend.name)}"
        ) from exc
