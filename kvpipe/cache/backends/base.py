"""What a quantization backend is: one class per backend, registered by subclassing.

A backend knows the bit widths it takes, its `backend.*` settings, how the three axis layouts map
to its raw axis numbers, the layer class that stores its keys and values, and the bytes those
layers hold. `cache=quantized` and `kvpipe plan` ask the registry; nobody else names a backend.
Pure Python at import: the layer classes (torch) load only when a cache is built.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, Mapping, Optional

from kvpipe.errors import ConfigError, choices, require_choice
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
    test_overrides: ClassVar[tuple[str, ...]] = ("cache=quantized",)  # the strategy that reads a backend

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

    def residual_length(self) -> int | None:
        """The newest tokens each layer keeps in full precision before quantizing them; None: none."""
        return None

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

    def dequantized_tokens(self, window: Optional[int], prompt_tokens: int, new_tokens: int) -> int:
        """Tokens one decode step dequantizes in a layer (window None: full attention), once new_tokens
        follow the prompt. By default every token the layer holds, which is right for a backend that
        keeps its layers quantized whole, with no full-precision residual (a sliding layer holds
        window - 1 between steps); a backend with a residual says what it dequantizes."""
        held = prompt_tokens + new_tokens - 1  # the last generated token is never fed back
        return held if window is None else min(held, window - 1)


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
