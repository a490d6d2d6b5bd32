"""What an eviction press is: one class per press, registered by subclassing, as backends are.

A press removes prompt tokens from each full-attention layer's cache once the prompt has been read
(evicting, not storing fewer bits: the other way to shrink a KV cache). It knows its `press.*`
settings, their checks, which tokens each layer keeps (its `keep`, on torch tensors, loaded only
when a cache is built) and so the tokens and bytes a layer holds. Prefill attention still reads
every prompt token; the cache keeps the press's choice, then grows as usual (or, for a press that
`bounds` the cache, stays at its budget). Sliding-window layers are left as they are: they already
keep a window. A strategy composes the press with its own layers (`CacheStrategy.press`); nobody
else names a press. Definitions follow NVIDIA's kvpress (`kvpress/presses/*_press.py`) and the
papers it cites; the code is kvpipe's own. Pure Python at import.
"""

from __future__ import annotations

import dataclasses
import math
from typing import ClassVar, Mapping

from kvpipe.errors import ConfigError
from kvpipe.registry import Registered, Registry
from kvpipe.units import param_text


class Press(Registered):
    """Base class: subclass it with `name` and `Settings`, and override `keep`."""

    registry: ClassVar[Registry[Press]] = Registry("press.name")
    Settings: ClassVar[type]
    evicts: ClassVar[bool] = True  # False only for press=none
    bounds: ClassVar[bool] = False  # keeps evicting while decoding: the cache never grows past its budget
    needs_queries: ClassVar[bool] = False  # scores with the prompt's queries (its attention must expose q_proj)
    # the cache layers it composes with: "dense" (DynamicCache's) and "quantized" (evict, then quantize)
    composes_with: ClassVar[tuple[str, ...]] = ("dense", "quantized")
    search_ratios: ClassVar[tuple[float, ...]] = (0.25, 0.5, 0.75)  # what `kvpipe advise` walks, safest first
    in_label: ClassVar[tuple[str, ...]] = ("press.name", "press.ratio")  # params its label spells out

    def __init__(self, press_cfg):
        self.settings = self.Settings(**{f.name: getattr(press_cfg, f.name) for f in dataclasses.fields(self.Settings)})

    # ---- what it reads ------------------------------------------------------------------------

    @classmethod
    def read_fields(cls) -> tuple[str, ...]:
        if not cls.evicts:
            return ()  # press=none: every job keyed and logged as before presses existed
        return ("press.name", *(f"press.{f.name}" for f in dataclasses.fields(cls.Settings)))

    @classmethod
    def command_overrides(cls, params: Mapping[str, str]) -> list[str]:
        """press=NAME and the settings off their YAML defaults."""
        if not cls.evicts:
            return []
        words = [f"press={cls.name}"]
        for setting in dataclasses.fields(cls.Settings):
            value = params.get(f"press.{setting.name}")
            if value is not None and value != param_text(setting.default):
                words.append(f"press.{setting.name}={value}")
        return words

    @classmethod
    def search_points(cls) -> list[dict[str, str]]:
        """Every configuration of this press a search may measure, safest (least evicted) first."""
        return [{"press": cls.name, "press.ratio": str(ratio)} for ratio in cls.search_ratios] if cls.evicts else []

    def label(self) -> str:
        """'snapkv0.5': how tables name it beside the cache."""
        return f"{self.name}{self.settings.ratio:g}"

    # ---- checks -------------------------------------------------------------------------------

    def check(self) -> list[str]:
        """Checks against the config alone; returns warnings."""
        ratio = self.settings.ratio
        if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not 0 <= ratio < 1:
            raise ConfigError(
                "press.ratio", ratio, "expected the fraction of the prompt's KV removed, from 0 up to (not including) 1"
            )
        return []

    def check_compose(self, strategy: str, layers: str | None) -> None:
        """Refuse a cache whose layers (a strategy's `press_layers`) this press cannot evict from."""
        if layers in self.composes_with:
            return
        why = (
            f"cache={strategy} preallocates or moves its layers, so evicting would free nothing"
            if layers is None
            else f"press={self.name} evicts at every decoding step, which a {layers} layer would redo in full each time"
        )
        raise ConfigError("press.name", self.name, f"{why}; expected {self.compatible_caches()}")

    def compatible_caches(self) -> str:
        return " or ".join({"dense": "cache=dynamic", "quantized": "cache=quantized"}[k] for k in self.composes_with)

    @classmethod
    def check_for_model(cls, model_type: str, full_layers: int) -> None:
        """Checks that need the model's config, before the weights load."""
        if full_layers == 0:
            raise ConfigError(
                "press.name", cls.name,
                "every layer of this model slides, and a press evicts from full-attention layers only; expected press=none",
            )  # fmt: skip

    def check_prompt(self, prompt_tokens: int) -> None:
        """Checks against the shortest prompt, before the weights load."""

    # ---- tokens -------------------------------------------------------------------------------

    def kept(self, prompt_tokens: int) -> int:
        """Prompt tokens a full-attention layer keeps after prefill: the ratio's share removed, rounded down."""
        return prompt_tokens - math.floor(prompt_tokens * self.settings.ratio)

    def layer_tokens(self, prompt_tokens: int, new_tokens: int) -> int:
        """Tokens a dense full-attention layer holds once new_tokens follow the prompt (the last generated
        token is never fed back)."""
        return self.kept(prompt_tokens) + new_tokens - 1

    def token_share(self) -> float:
        """What a full-attention layer keeps of each prompt token, in the long run."""
        return 1 - self.settings.ratio

    def fixed_tokens(self) -> int:
        """Tokens a full-attention layer holds however long the context (a bounded budget); 0: none."""
        return 0

    def keep(self, keys, values, queries, module):
        """The indices [batch, kv_heads, kept] of the prompt tokens each head keeps (torch)."""
        raise NotImplementedError

    def trim(self, layer, prompt_tokens: int) -> None:
        """After a decoding step: what a `bounds` press evicts from the layer (dense layers only)."""


REGISTRY = Press.registry.classes  # name -> press class
registered = Press.registry.registered
names = Press.registry.names
get = Press.registry.get  # raises a one-line ConfigError naming the registered ones
