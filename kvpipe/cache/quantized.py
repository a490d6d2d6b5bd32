"""cache=quantized: QuantizedCache with keys and values as low-bit integers, through a backend.

What the integers look like (bit widths, axes, layers, bytes) is the backend's business
(`kvpipe.cache.backends`); this strategy asks the one that `backend.name` selects.

transformers' QuantizedCache refuses any model with a layer that is not full attention. kvpipe
builds the layers itself, from the same per-layer types transformers' caches use: full-attention
layers quantized, sliding (and chunked) layers kept dense at their window as DynamicCache keeps
them, or with cache.quantize_sliding=true quantized too, in kvpipe's window-keeping layers.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Mapping

from kvpipe.cache import accounting, backends
from kvpipe.cache.base import CacheSetup, CacheStrategy
from kvpipe.config import option_schema, retyped
from kvpipe.errors import ConfigError


class Quantized(CacheStrategy):
    name = "quantized"
    family = "quantized"
    lossless = False
    order = 50
    in_label = ("backend.name", "backend.nbits", "axis.layout")
    late_defaults = {"quantize_sliding": False}
    press_layers = "quantized"  # a press evicts from the prompt, then the layer quantizes what is kept
    continues_cache = True  # its layers keep appending (never cropped back: kvpipe.job.kept_caches)

    @dataclass
    class Settings:
        # false: sliding-window layers stay dense at their window; true: quantized too (quanto, hqq)
        quantize_sliding: bool = False

    def __init__(self, choice):
        super().__init__(choice)
        self.backend = backends.get(choice.backend.name)(choice.backend, choice.axis)

    @classmethod
    def read_fields(cls, backend_name: str | None = None) -> tuple[str, ...]:
        backend = backends.base.REGISTRY.get(backend_name)
        if backend is None:  # a backend no longer registered: assume it read everything
            return (*super().read_fields(), "backend.*", "axis.*")
        return (*super().read_fields(), *backend.read_fields())

    @classmethod
    def search_points(cls, head_dim: int, group_sizes, residual_lengths) -> list[dict[str, str]]:
        """Each registered backend's own points (its bit widths, axes, group sizes and residuals)."""
        return [
            {"cache": cls.name, **point}
            for backend in backends.registered()
            for point in backend.search_points(head_dim, group_sizes, residual_lengths)
        ]

    @classmethod
    def command_overrides(cls, params: Mapping[str, str]) -> list[str]:
        backend = backends.get(params.get("backend.name", ""))
        return [*super().command_overrides(params), *backend.command_overrides(params)]

    def check(self, overridden=frozenset()) -> list[str]:
        self.backend.check()
        if self.settings.quantize_sliding and not self.backend.quantizes_windows:
            windowed = " or ".join(f"backend={b.name}" for b in backends.registered() if b.quantizes_windows)
            raise ConfigError(
                "cache.quantize_sliding",
                True,
                f"backend={self.backend.name} has no layer that keeps a sliding window; expected {windowed}, "
                "or cache.quantize_sliding=false",
            )
        return super().check(overridden)

    def check_for_model(self, shape, prompt_tokens: int) -> None:
        super().check_for_model(shape, prompt_tokens)
        try:
            accounting.kv_shape(shape, 1, "float16")
        except accounting.UnpredictableLayers as exc:
            raise ConfigError("cache.strategy", self.name, f"kvpipe builds quantized layers for {exc}") from exc
        self.backend.check_for_model(shape)

    def quantizes(self, window) -> bool:
        """Whether the layer with this window (None: full attention) is quantized."""
        return window is None or self.settings.quantize_sliding

    def quantized_layers(self, windows) -> str:
        """Which of the layers that hold KV (their windows) are quantized, as the run's params say:
        '3 of 18 (full_attention)', or '18 of 18 (all)'."""
        count = sum(self.quantizes(window) for window in windows)
        return f"{count} of {len(windows)} ({'all' if count == len(windows) else 'full_attention'})"

    def build(self, loaded, longest_prompt: int) -> CacheSetup:
        from transformers.cache_utils import DummyLayer, DynamicSlidingWindowLayer

        from kvpipe.cache.backends._layers import LayeredQuantizedCache

        backend = self.backend
        backend.require_available()
        backend.warm(loaded.device, loaded.model.dtype)
        options = backend.cache_options()

        def layer(kind: str, window: int | None):
            if kind in accounting.NO_KV_TYPES:
                return DummyLayer()
            if window is None:
                return backend.layer_class()(**options)
            if self.settings.quantize_sliding:
                return backend.sliding_layer_class()(sliding_window=window, **options)
            return DynamicSlidingWindowLayer(sliding_window=window)

        def make(capacity: int = 0):  # the layers transformers' own caches build, from the model's shape
            return LayeredQuantizedCache([layer(each.attention, each.window) for each in loaded.shape.layers])

        windows = accounting.kv_shape(loaded.shape, 1, loaded.dtype).windows
        params = {"cache.quantized_layers": self.quantized_layers(windows)}
        return CacheSetup(requested=self.name, effective=self.label(), make_cache=make, params=params)

    def label(self) -> str:
        return f"{self.name}:{self.backend.label()}"

    def quality_batching(self, compiled: bool = False) -> str:
        batching = self.backend.quality_batching()
        return "equal_length" if batching == "padded" and self.press.evicts else batching  # a press: no padding

    def decode_kv_traffic_bytes(self, kv, kv_bytes: int, prompt_tokens: int, new_tokens: int, device: str):
        """Each step reads the packed cache, the residual and the dense sliding layers (kv_bytes), writes
        each quantized layer dequantized to the model dtype, and attention reads that copy back:
        kv_bytes + 2 x the dequantized tokens of the quantized layers (a window's at most)."""
        dequantized = sum(self._dequantized_tokens(kv, prompt_tokens, new_tokens))
        return kv_bytes + 2 * dequantized * kv.token_bytes()

    def dequantized_copy_bytes(self, kv, prompt_tokens: int, new_tokens: int) -> int:
        """Attention dequantizes one layer at a time: the largest layer's copy, in the model dtype."""
        return max(self._dequantized_tokens(kv, prompt_tokens, new_tokens), default=0) * kv.token_bytes()

    def _dequantized_tokens(self, kv, prompt_tokens: int, new_tokens: int) -> list[int]:
        """Per quantized layer, the tokens a decode step dequantizes (a window's at most)."""
        return [
            self.backend.dequantized_tokens(window, self.layer_prompt(window, prompt_tokens), new_tokens)
            for window in kv.windows
            if self.quantizes(window)
        ]

    def layer_prompt(self, window, prompt_tokens: int) -> int:
        """The prompt a layer stores: a full-attention layer stores what its press kept."""
        return self.full_layer_prompt(prompt_tokens) if window is None else prompt_tokens

    def predict_kv_bytes(self, kv, prompt_tokens: int, new_tokens: int) -> int:
        return sum(
            self.backend.layer_bytes(kv, window, self.layer_prompt(window, prompt_tokens), new_tokens)
            if self.quantizes(window)
            else accounting.dynamic_layer_tokens(window, prompt_tokens, new_tokens) * kv.token_bytes()
            for window in kv.windows
        )

    def bytes_per_token(self, kv) -> float:
        return kv.full_layers * self.backend.token_bytes(kv) * self.press.token_share()

    def window_bytes(self, kv) -> int:
        if not self.settings.quantize_sliding:
            return accounting.window_bytes(kv)
        return sum(self.backend.window_bytes(kv, window) for window in kv.sliding_windows)

    @classmethod
    def plan_variants(cls, choice, shape):
        """The configured backend, then each backend's usual bit widths (default axes), then the
        backends that read no axis; grouped backends only where q_group_size divides head_dim. On a
        model with sliding layers, the configured backend once more with quantize_sliding flipped."""
        rows = cls._backend_variants(choice, shape.head_dim)
        configured = backends.get(choice.backend.name)
        if shape.has_sliding_layers and configured.quantizes_windows and rows:
            label, variant = rows[0]
            flipped = not variant.cache.quantize_sliding
            other = replace(variant, cache=replace(variant.cache, quantize_sliding=flipped))
            rows.insert(1, (f"{label} {'+sliding' if flipped else '(full only)'}", other))
        return rows

    @classmethod
    def _backend_variants(cls, choice, head_dim: int):
        configured = backends.get(choice.backend.name)
        default_axis = replace(choice.axis, key=None, value=None)
        wanted = [(configured, choice.backend.nbits, choice.axis)] if configured.axes else []
        wanted += [(backend, nbits, default_axis) for backend in backends.registered() for nbits in backend.plan_nbits]
        rows: dict[str, object] = {}
        for backend, nbits, axis in wanted:
            variant = choice.with_strategy(cls.name, backend=_as_backend(choice.backend, backend, nbits), axis=axis)
            raw = (axis.key, axis.value) != (None, None)
            label = f"{backend.name} int{nbits} {axis.layout}" + (" (raw axes)" if raw else "")
            if variant.strategy.backend.fits_head_dim(head_dim):
                rows.setdefault(label, variant)
        for backend in backends.registered():
            if not backend.axes:
                nbits = backend.default_nbits()
                rows[backend.name] = choice.with_strategy(cls.name, backend=_as_backend(choice.backend, backend, nbits))
        return list(rows.items())

    @classmethod
    def plan_notes(cls, choice, shape) -> list[str]:
        notes = []
        if shape.has_sliding_layers:
            which = (
                "quantized too"
                if choice.with_strategy(cls.name).cache.quantize_sliding
                else "dense at their windows (cache.quantize_sliding=false)"
            )
            notes.append(
                "transformers' QuantizedCache refuses sliding-window layers; kvpipe quantizes the full-attention "
                f"layers and keeps the sliding ones {which}"
            )
        grouped = [b for b in backends.registered() if b.axes]
        configured = backends.get(choice.backend.name)
        # the grouped rows' settings: the configured backend's, or a grouped one's defaults
        shown = choice.backend if configured.axes else _as_backend(choice.backend, grouped[0])
        if shape.head_dim % shown.q_group_size:
            return notes + [
                f"{' and '.join(b.name for b in grouped)} rows left out: backend.q_group_size="
                f"{shown.q_group_size} does not divide head_dim={shape.head_dim}"
            ]
        return notes + [
            f"quantized sizes include the full-precision residual (< backend.residual_length="
            f"{shown.residual_length} tokens) and token padding; KV B/token is the long-run cost. "
            "Decoding also dequantizes one layer's keys and values at a time (transient: counted by --hardware's fits)"
        ]


def _as_backend(config, backend: type[backends.QuantBackend], nbits: int | None = None):
    """A backend group's config as `backend`'s, the settings both declare kept (nbits: this width)."""
    changes = {} if nbits is None else {"nbits": nbits}
    return retyped(config, option_schema(backend), **changes)
