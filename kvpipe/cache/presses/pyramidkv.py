"""press=pyramidkv: PyramidKV (Cai et al. 2024, "PyramidKV: Dynamic KV cache compression based on
pyramidal information funneling"; kvpress's PyramidKVPress): SnapKV's scores, with a budget per
layer that falls linearly from the first layer to the last, the lower layers keeping more. The
budgets average the ratio's share of the prompt; `press.beta` sets how steep the pyramid is (the
last layer keeps 1/beta of the average, window included). Where the pyramid would not fit the
prompt (its smallest budget under the window, or its largest over the prompt), every layer keeps
the ratio's share, as SnapKV does. Budgets are per layer, so every KV head of a layer keeps as many
tokens and transformers' layers hold them as they are (a per-head budget, as AdaKV's, would leave
heads of one layer different lengths, which kvpress only masks and kvpipe does not offer).

Budgets follow kvpress's, which round differently from the other presses: a layer keeps
round(prompt x (1 - ratio)) where the pyramid does not fit, not prompt - floor(prompt x ratio)."""

from __future__ import annotations

from dataclasses import dataclass

from kvpipe.cache.presses.snapkv import SnapKV
from kvpipe.errors import ConfigError


class PyramidKV(SnapKV):
    name = "pyramidkv"
    order = 35
    composes_with = ("dense",)  # a quantized layer's bytes are planned at one budget for every layer
    test_overrides = ("press.window=4", "press.beta=2")

    @dataclass
    class Settings(SnapKV.Settings):
        beta: int = 20  # the pyramid's steepness: the last layer keeps 1/beta of the average

    def check(self, given: frozenset[str] = frozenset()) -> list[str]:
        warnings = super().check(given)
        if self.settings.beta < 1:
            raise ConfigError("press.beta", self.settings.beta, "expected 1 or more (20 in PyramidKV)")
        return warnings

    def layer_kept(self, prompt_tokens: int, layer: int, layers: int) -> int:
        """What layer `layer` of `layers` keeps of the prompt (kvpress's `get_layer_budget`)."""
        s = self.settings
        average = prompt_tokens * (1 - s.ratio)  # what each layer keeps past the window, on average
        least = average / s.beta
        most = average * 2 - least
        if most >= prompt_tokens - s.window:
            most = prompt_tokens - s.window
            least = average * 2 - most
        if not prompt_tokens >= most >= least >= s.window:
            return max(1, round(average))
        step = (most - least) / (layers - 1) if layers > 1 else 0.0
        return round(most - layer * step)

    def kept_in(self, module, prompt_tokens: int) -> int:
        return self.layer_kept(prompt_tokens, module.layer_idx, module.config.num_hidden_layers)

    def layer_tokens_at(self, layer: int, layers: int, prompt_tokens: int, new_tokens: int) -> int:
        return self.layer_kept(prompt_tokens, layer, layers) + new_tokens - 1
