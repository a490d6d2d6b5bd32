"""load=concurrency: a closed loop keeping N requests in flight; each one that finishes lets the next in
(vLLM's --max-concurrency, GuideLLM's concurrent profile). `load.concurrency=1,4,16` sweeps it."""

from __future__ import annotations

from dataclasses import dataclass

from kvpipe.errors import ConfigError
from kvpipe.load.base import Load


class Concurrency(Load):
    name = "concurrency"
    order = 20
    closed = True
    test_overrides = ("load.concurrency=2",)

    @dataclass
    class Settings:
        concurrency: int = 4  # requests in flight at once

    def check(self) -> None:
        super().check()
        if self.settings.concurrency < 1:
            raise ConfigError("load.concurrency", self.settings.concurrency, "expected 1 or more requests in flight")

    def in_flight(self, requests) -> int:
        return min(self.settings.concurrency, len(requests))

    def label(self) -> str:
        return f"concurrency({self.settings.concurrency})"

    def served_label(self, requests) -> str:
        """concurrency(4; asked 16) where only 4 requests were there to keep in flight."""
        asked = self.settings.concurrency
        return self.label() if len(requests) >= asked else f"concurrency({len(requests)}; asked {asked})"

    def notes(self, requests) -> list[str]:
        asked, served = self.settings.concurrency, len(requests)
        if served >= asked:
            return []
        return [f"load.concurrency={asked} but only {served} requests: at most {served} in flight "
                "(load.requests sets how many)"]  # fmt: skip
