"""What a quantization backend is: one class per backend, registered by subclassing.

A backend knows the bit widths it takes, its `backend.*` settings, how the three axis layouts map
to its raw axis numbers, the layer class that stores its keys and values, and the bytes those
layers hold. `cache=quantized` and `kvpipe plan` ask the registry; nobody else names a backend.
Pure Python at import: the layer classes (torch) load only when a cache is built.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import Any, ClassVar, Mapping, Optional

from kvpipe.errors import ConfigError, KvpipeError, choices, first_line, require_choice
from kvpipe.registry import Registered, Registry

LAYOUTS = ("per_token", "per_channel", "kivi")  # kivi: keys per-channel, values per-token
# The layouts each one keeps at least as exact at equal bits (the search's prior, kvpipe.orchestrate.search.frontier):
# keys' outliers sit in a few channels and values' in a few tokens (KIVI, Liu et al. 2024), so kivi's
# split loses least; per-token and per-channel each misplace one of the two, and are not ordered.
LAYOUTS_SAFER_THAN = {"kivi": ("per_token", "per_channel")}
AXIS_FIELDS = ("axis.layout", "axis.key", "axis.value")


class QuantBackend(Registered):
    """Base class: subclass it with `name`, `nbits_choices` and `Settings`."""

    registry: ClassVar[Registry[QuantBackend]] = Registry("backend.name")
    nbits_choices: ClassVar[tuple[int, ...]]
    plan_nbits: ClassVar[tuple[int, ...]] = ()  # extra rows `kvpipe plan` shows, one per bit width
    Settings: ClassVar[type]  # dataclass of the backend.* fields it reads (nbits included)
    # layout -> (key axis, value axis) in the backend's own numbering; empty: no axis is read
    axes: ClassVar[dict[str, tuple[int, int]]] = {}
    # kvpipe has a layer for it that keeps a sliding window quantized (cache.quantize_sliding=true)
    quantizes_windows: ClassVar[bool] = False

    def __init__(self, backend_cfg, axis_cfg):
        self.settings = self.Settings(
            **{f.name: getattr(backend_cfg, f.name) for f in dataclasses.fields(self.Settings)}
        )
        self.axis = axis_cfg

    @classmethod
    def valid_axes(cls) -> tuple[int, ...]:
        return tuple(sorted({number for pair in cls.axes.values() for number in pair}))

    @classmethod
    def read_fields(cls) -> tuple[str, ...]:
        settings = tuple(f"backend.{f.name}" for f in dataclasses.fields(cls.Settings))
        return ("backend.name", *settings, *(AXIS_FIELDS if cls.axes else ()))

    @classmethod
    def default_nbits(cls) -> int:
        return next(f.default for f in dataclasses.fields(cls.Settings) if f.name == "nbits")

    @classmethod
    def command_overrides(cls, params: Mapping[str, str]) -> list[str]:
        """backend=NAME, its bit width, the settings off their defaults, and the axis layout."""
        words = [f"backend={cls.name}", f"backend.nbits={params.get('backend.nbits')}"]
        if cls.axes:
            words.append(f"axis={params.get('axis.layout')}")
            words += [f"{name}={params[name]}" for name in AXIS_FIELDS[1:] if params.get(name) not in (None, "None")]
        for setting in dataclasses.fields(cls.Settings):
            value = params.get(f"backend.{setting.name}")
            if setting.name != "nbits" and value is not None and value != str(setting.default):
                words.append(f"backend.{setting.name}={value}")
        return words

    @classmethod
    def search_points(cls, head_dim: int, group_sizes, residual_lengths) -> list[dict[str, str]]:
        """Every configuration of this backend a search may measure: its bit widths and axis layouts."""
        layouts = [{"axis": layout} for layout in LAYOUTS if layout in cls.axes] or [{}]
        return [
            {"backend": cls.name, "backend.nbits": str(nbits), **layout}
            for nbits in cls.nbits_choices
            for layout in layouts
        ]

    # ---- checks -------------------------------------------------------------------------------

    def check(self) -> None:
        require_choice(f"backend.nbits (backend={self.name})", self.settings.nbits, self.nbits_choices)
        if not self.axes:
            return
        require_choice("axis.layout", self.axis.layout, LAYOUTS)
        for side in ("key", "value"):
            value = getattr(self.axis, side)
            if value is not None:
                require_choice(f"axis.{side} (backend={self.name})", value, self.valid_axes())

    def check_for_model(self, shape) -> None:
        """Checks that need the model's shape."""

    def fits_head_dim(self, head_dim: int) -> bool:
        return True

    def raw_axes(self) -> tuple[int, int]:
        """(axis_key, axis_value) for the layers."""
        return backend_axes(self.name, self.axis.layout, self.axis.key, self.axis.value)

    # ---- building -----------------------------------------------------------------------------

    @classmethod
    def require_available(cls) -> None:
        """Raise a one-line KvpipeError if this backend cannot run with the installed packages."""

    def cache_options(self) -> dict[str, Any]:
        """Keyword arguments for QuantizedCache and the layer class."""
        return {}

    @classmethod
    def layer_class(cls) -> type:
        """The layer class that keeps a full-attention layer's keys and values."""
        raise NotImplementedError

    @classmethod
    def sliding_layer_class(cls) -> type:
        """The layer class that keeps a sliding window quantized (where `quantizes_windows`)."""
        raise NotImplementedError

    @classmethod
    def warm(cls, device: str, dtype) -> None:
        """Quantize once per process before anything is timed (see GroupedBackend)."""

    def label(self) -> str:
        return self.name

    def quality_batching(self) -> str:
        """How the quality pass may batch windows (CacheStrategy.quality_batching): a scale over the
        whole tensor spans the batch's rows, so by default windows are scored apart."""
        return "apart"

    # ---- bytes ---------------------------------------------------------------------------------

    def layer_bytes(self, kv, window: Optional[int], prompt_tokens: int, new_tokens: int) -> int:
        """What one quantized layer (window None: full attention) holds once new_tokens follow the prompt."""
        raise NotImplementedError

    def token_bytes(self, kv) -> float:
        """What one more token costs one quantized full-attention layer in the long run."""
        raise NotImplementedError

    def window_bytes(self, kv, window: int) -> int:
        """The most one quantized sliding layer holds once past its window."""
        raise NotImplementedError


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


REGISTRY = QuantBackend.registry.classes  # name -> backend class
registered = QuantBackend.registry.registered
names = QuantBackend.registry.names
get = QuantBackend.registry.get  # raises a one-line ConfigError naming the registered ones


def alternatives(name: str) -> str:
    """'backend=hqq or backend=fp8': what to try instead of `name`."""
    return " or ".join(f"backend={other}" for other in names() if other != name)


def axis_numbers() -> dict[str, dict[str, tuple[Optional[int], Optional[int]]]]:
    """Backend -> layout -> (key axis, value axis), for backends that read an axis."""
    return {b.name: dict(b.axes) for b in registered() if b.axes}


def backend_axes(backend: str, layout: str, key_override: Optional[int] = None, value_override: Optional[int] = None):
    """(axis_key, axis_value) for a backend and layout; an override replaces the layout's number for its side."""
    if backend not in axis_numbers():
        raise ConfigError("backend.name", backend, choices(axis_numbers()))
    valid = get(backend).valid_axes()
    require_choice("axis.layout", layout, LAYOUTS)
    for field, value in (("axis.key", key_override), ("axis.value", value_override)):
        if value is not None:
            require_choice(field, value, valid)
    key, value = axis_numbers()[backend][layout]
    return (key if key_override is None else key_override), (value if value_override is None else value_override)
