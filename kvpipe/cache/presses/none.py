"""press=none: nothing is evicted (the default); every job is keyed and measured as before presses."""

from __future__ import annotations

from dataclasses import dataclass

from kvpipe.cache.presses.base import Press


class NoPress(Press):
    name = "none"
    order = 0
    evicts = False

    @dataclass
    class Settings:
        pass

    def check(self, given: frozenset[str] = frozenset()) -> list[str]:
        return []

    def check_compose(self, strategy, layers) -> None:
        pass

    @classmethod
    def check_for_model(cls, model_type, full_layers) -> None:
        pass

    def label(self) -> str:
        return ""

    def token_share(self) -> float:
        return 1.0
