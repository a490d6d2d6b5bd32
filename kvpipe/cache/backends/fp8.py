"""backend=fp8: transformers' per-tensor FP8 (e4m3) layer, where the installed transformers has one.

Group size, residual length and axis do not apply: one float32 scale per tensor, no residual.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvpipe.cache.backends.base import QuantBackend, alternatives
from kvpipe.errors import KvpipeError

SCALE_BYTES = 4  # Fp8QuantizedLayer keeps one float32 scale per tensor


class FP8(QuantBackend):
    name = "fp8"
    order = 30
    nbits_choices = (8,)

    @dataclass
    class Settings:
        nbits: int = 8

    @classmethod
    def require_available(cls) -> None:
        import transformers
        import transformers.cache_utils as cache_utils

        if not hasattr(cache_utils, "Fp8QuantizedLayer"):
            raise KvpipeError(
                f"backend=fp8 needs a transformers with Fp8QuantizedLayer; this one ({transformers.__version__}) "
                f"has none; use {alternatives(cls.name)}"
            )

    @classmethod
    def layer_class(cls):
        from transformers.cache_utils import Fp8QuantizedLayer

        return Fp8QuantizedLayer

    def layer_bytes(self, kv, window, prompt_tokens: int, new_tokens: int) -> int:
        held = prompt_tokens + new_tokens - 1  # one byte an element, no residual
        return 2 * (held * kv.elements_per_token + SCALE_BYTES)

    def token_bytes(self, kv) -> float:
        return 2 * kv.elements_per_token
