"""press=streaming: StreamingLLM (Xiao et al. 2023, "Efficient streaming language models with
attention sinks"; kvpress's StreamingLLMPress): keep the first `press.sinks` tokens and a recent
window of the prompt. Rolling (`press.rolling`, the default under press.protocol=query_aware), it
keeps them again at every decoding step, so the cache never grows past its budget: StreamingLLM's own
window. Compressed once (the default under query_agnostic, as kvpress's StreamingLLMPress does), the
question and the answer are appended after what the prompt kept.

`press.window` is the recent window as transformers' sliding layers count it: a decoding step
attends to the sinks and the last `window` tokens, itself included, so `window - 1` stay cached
between steps. Left null, the window follows from `press.ratio`: the cache keeps what the ratio
leaves of the prompt. With sinks 0 it keeps exactly what DynamicSlidingWindowLayer keeps.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from kvpipe.cache.presses.base import Press
from kvpipe.errors import ConfigError


class Streaming(Press):
    name = "streaming"
    order = 10
    can_roll = True
    in_label = ("press.name", "press.ratio", "press.window", "press.protocol", "press.rolling")
    composes_with = ("dense",)  # re-quantizing a layer at every step would cost more than it saves
    test_overrides = ("press.sinks=2",)

    @dataclass
    class Settings:
        ratio: float = 0.5  # the fraction of the prompt's KV removed (when press.window is null)
        sinks: int = 4  # first tokens always kept ("attention sinks")
        window: Optional[int] = None  # recent tokens a step attends to; null: from press.ratio

    def name_with_settings(self) -> str:
        s = self.settings
        return f"{self.name}{s.ratio:g}" if s.window is None else f"{self.name}{s.sinks}+{s.window}"

    def check(self, given: frozenset[str] = frozenset()) -> list[str]:
        warnings = super().check(given)
        s = self.settings
        if s.sinks < 0:
            raise ConfigError("press.sinks", s.sinks, "expected a count of first tokens to keep, 0 or more")
        if s.window is not None and s.window < 1:
            raise ConfigError(
                "press.window", s.window, "expected a positive number of recent tokens, or null to follow press.ratio"
            )
        if s.window is not None and "press.ratio" in given:  # the YAML's ratio is nothing the user said
            warnings.append(f"press.ratio={s.ratio:g} is ignored: press.window={s.window} sets what streaming keeps")
        return warnings

    def check_prompt(self, prompt_tokens: int) -> None:
        s = self.settings
        if s.window is not None and s.window > prompt_tokens:
            raise ConfigError("press.window", s.window, f"expected at most the shortest prompt, {prompt_tokens} tokens")
        if s.window is not None and s.sinks + s.window > prompt_tokens:
            raise ConfigError(
                "press.sinks", s.sinks,
                f"press.sinks + press.window = {s.sinks + s.window} is longer than the shortest prompt "
                f"({prompt_tokens} tokens); expected at most {prompt_tokens - s.window} sinks",
            )  # fmt: skip
        if s.window is None and self.kept(prompt_tokens) <= s.sinks:
            raise ConfigError(
                "press.ratio", s.ratio,
                f"it leaves {self.kept(prompt_tokens)} of the shortest prompt's {prompt_tokens} tokens, no more than "
                f"press.sinks={s.sinks}; expected a smaller ratio or fewer sinks",
            )  # fmt: skip

    def budget(self, prompt_tokens: int) -> int:
        """Tokens cached between steps: the sinks and window - 1 recent ones."""
        s = self.settings
        return s.sinks + s.window - 1 if s.window is not None else self.kept(prompt_tokens)

    def kept(self, prompt_tokens: int) -> int:
        if self.settings.window is None:
            return super().kept(prompt_tokens)
        return min(prompt_tokens, self.budget(prompt_tokens))

    def token_share(self) -> float:
        return 0.0 if self.settings.window is not None else super().token_share()

    def fixed_tokens(self) -> int:
        s = self.settings
        return 0 if s.window is None else s.sinks + s.window - 1

    def layer_tokens(self, prompt_tokens: int, new_tokens: int) -> int:
        if not self.rolls:
            return super().layer_tokens(prompt_tokens, new_tokens)
        return min(prompt_tokens + new_tokens - 1, self.budget(prompt_tokens))

    def protected(self, prompt_tokens: int) -> tuple[int, int]:
        sinks = min(self.settings.sinks, prompt_tokens)
        return sinks, self.kept(prompt_tokens) - sinks

    def score(self, module, hidden_states, keys, values, attentions, position_embeddings):
        return keys.new_zeros(keys.shape[:3])  # what it keeps is where tokens sit: all of it `protected`

    def trim(self, layer, prompt_tokens: int) -> None:
        import torch

        over = layer.keys.shape[-2] - self.budget(prompt_tokens)
        if over > 0:
            sinks = self.settings.sinks
            layer.keys = torch.cat([layer.keys[..., :sinks, :], layer.keys[..., sinks + over :, :]], dim=-2)
            layer.values = torch.cat([layer.values[..., :sinks, :], layer.values[..., sinks + over :, :]], dim=-2)
