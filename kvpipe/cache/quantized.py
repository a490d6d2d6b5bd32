"""cache=quantized: QuantizedCache with keys and values as low-bit integers, through a backend.

What the integers look like (bit widths, axes, layers, bytes) is the backend's business
(`kvpipe.cache.backends`); this strategy asks the one that `backend.name` selects.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Mapping

from kvpipe.cache import backends
from kvpipe.cache.base import CacheSetup, CacheStrategy


class Quantized(CacheStrategy):
    name = "quantized"
    family = "quantized"
    lossless = False
    order = 50
    supports_sliding_window = False  # QuantizedCache refuses sliding-window layers
    in_label = ("backend.name", "backend.nbits", "axis.layout")

    def __init__(self, spec):
        super().__init__(spec)
        self.backend = backends.get(spec.backend.name)(spec.backend, spec.axis)

    @classmethod
    def read_fields(cls, backend_name: str | None = None) -> tuple[str, ...]:
        backend = backends.base.REGISTRY.get(backend_name)
        if backend is None:  # a backend no longer registered: assume it read everything
            return (*super().read_fields(), "backend.*", "axis.*")
        return (*super().read_fields(), *backend.read_fields())

    @classmethod
    def command_overrides(cls, params: Mapping[str, str]) -> list[str]:
        backend = backends.get(params.get("backend.name", ""))
        return [*super().command_overrides(params), *backend.command_overrides(params)]

    def check(self, overridden=frozenset()) -> list[str]:
        self.backend.check()
        return super().check(overridden)

    def check_for_model(self, shape, prompt_tokens: int) -> None:
        super().check_for_model(shape, prompt_tokens)
        self.backend.check_for_model(shape)

    def build(self, loaded, longest_prompt: int) -> CacheSetup:
        from transformers import QuantizedCache

        backend = self.backend
        backend.require_available()
        backend.warm(loaded.device, loaded.model.dtype)
        options, layer_class = backend.cache_options(), backend.layer_class()

        def make(capacity: int = 0):
            cache = QuantizedCache(backend=backend.name, config=loaded.model.config, **options)
            if layer_class is not None:  # kvpipe's layers group as the axis names say at every length
                cache.layers = [layer_class(**options) for _ in cache.layers]
            return cache

        return CacheSetup(requested=self.name, effective=self.label(), make_cache=make)

    def label(self) -> str:
        return f"{self.name}:{self.backend.label()}"

    def decode_kv_traffic_bytes(self, kv_bytes: int, dense_kv_bytes: int, device: str) -> int | None:
        """Each step reads the packed cache and the residual (kv_bytes), writes the whole cache
        dequantized to the model dtype, and attention reads that copy back: kv_bytes + 2 x dense."""
        return kv_bytes + 2 * dense_kv_bytes

    def predict_kv_bytes(self, kv, prompt_tokens: int, new_tokens: int) -> int:
        return self.backend.predict_kv_bytes(kv, prompt_tokens, new_tokens)

    def bytes_per_token(self, kv) -> float:
        return self.backend.bytes_per_token(kv)

    @classmethod
    def plan_variants(cls, spec, head_dim: int):
        """The configured backend, then each backend's usual bit widths (default axes), then the
        backends that read no axis; grouped backends only where q_group_size divides head_dim."""
        configured = backends.get(spec.backend.name)
        default_axis = replace(spec.axis, key=None, value=None)
        wanted = [(configured, spec.backend.nbits, spec.axis)] if configured.axes else []
        wanted += [(backend, nbits, default_axis) for backend in backends.registered() for nbits in backend.plan_nbits]
        rows: dict[str, object] = {}
        for backend, nbits, axis in wanted:
            variant = spec.with_strategy(
                cls.name, backend=replace(spec.backend, name=backend.name, nbits=nbits), axis=axis
            )
            raw = (axis.key, axis.value) != (None, None)
            label = f"{backend.name} int{nbits} {axis.layout}" + (" (raw axes)" if raw else "")
            if variant.strategy.backend.fits_head_dim(head_dim):
                rows.setdefault(label, variant)
        for backend in backends.registered():
            if not backend.axes:
                nbits = backend.default_nbits()
                rows[backend.name] = spec.with_strategy(
                    cls.name, backend=replace(spec.backend, name=backend.name, nbits=nbits)
                )
        return list(rows.items())

    @classmethod
    def plan_notes(cls, spec, shape) -> list[str]:
        if shape.has_sliding_layers:
            return ["sliding-window layers: dense sizes are an upper bound; QuantizedCache refuses such models"]
        grouped = [b for b in backends.registered() if b.axes]
        if shape.head_dim % spec.backend.q_group_size:
            return [
                f"{' and '.join(b.name for b in grouped)} rows left out: backend.q_group_size="
                f"{spec.backend.q_group_size} does not divide head_dim={shape.head_dim}"
            ]
        return [
            f"quantized sizes include the full-precision residual (< backend.residual_length="
            f"{spec.backend.residual_length} tokens) and token padding; KV B/token is the long-run cost. "
            "Decoding also dequantizes one layer's keys and values at a time (transient, not counted)"
        ]
