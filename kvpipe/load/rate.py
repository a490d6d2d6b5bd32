"""load=rate: open-loop arrivals at R requests per second from a seed (vLLM's --request-rate and
--burstiness, GuideLLM's poisson profile), for load.requests requests or for load.duration_s seconds.
The gaps between arrivals are exponential (a Poisson process), or with load.burstiness gamma-distributed
with the same mean: below 1 burstier, above 1 steadier, 1 Poisson (vLLM's definition). A request waits
while the server is busy: its queueing delay counts in its TTFT. A workload's own arrival times are
load=replay's; this load draws its own, whatever the workload carries."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Optional

from kvpipe.errors import ConfigError
from kvpipe.load.base import Load, cycled


class Rate(Load):
    name = "rate"
    order = 30
    late_defaults = {"burstiness": 1.0}  # Poisson, as every rate run before burstiness was
    test_overrides = ("load.rate=50",)  # arrivals 20 ms apart on average: a quick run

    @dataclass
    class Settings:
        rate: float = 1.0  # requests per second, on average
        duration_s: Optional[float] = None  # arrivals for this long instead of load.requests
        seed: int = 0  # the arrival times' seed: the same seed, the same times
        burstiness: Optional[float] = None  # the gaps' gamma shape; null (or 1): Poisson

    def check(self) -> None:
        super().check()
        if not (self.settings.rate > 0 and math.isfinite(self.settings.rate)):
            raise ConfigError("load.rate", self.settings.rate, "expected requests per second above 0, e.g. 2.5")
        burstiness = self.settings.burstiness
        if burstiness is not None and not (burstiness > 0 and math.isfinite(burstiness)):
            raise ConfigError(
                "load.burstiness", burstiness,
                "expected a number above 0 (1: Poisson, below 1: burstier, above 1: steadier), or null for Poisson",
            )  # fmt: skip
        if self.settings.duration_s is not None:
            if not self.settings.duration_s > 0:
                raise ConfigError("load.duration_s", self.settings.duration_s, "expected seconds above 0, or null")
            if self.config.requests is not None:
                raise ConfigError(
                    "load.duration_s", self.settings.duration_s, "give load.requests or load.duration_s, not both"
                )

    def requests(self, prompts) -> list:
        if self.settings.duration_s is None:
            return super().requests(prompts)
        arrived = len(self._times(lambda times: times[-1] >= self.settings.duration_s)) - 1
        return cycled(prompts, arrived or 1)

    def arrivals(self, requests) -> list[float]:
        return self._times(lambda times: len(times) >= len(requests))[: len(requests)]

    def _times(self, enough) -> list[float]:
        """Gaps of mean 1/rate from the seed, the first request at 0, until enough."""
        draw, times = random.Random(self.settings.seed), [0.0]
        while not enough(times):
            times.append(times[-1] + self._gap(draw))
        return times

    def _gap(self, draw: random.Random) -> float:
        shape = self.settings.burstiness
        if shape in (None, 1.0):  # exponential: the draws every Poisson run made
            return draw.expovariate(self.settings.rate)
        return draw.gammavariate(shape, 1.0 / (self.settings.rate * shape))

    def label(self) -> str:
        shape = self.settings.burstiness
        bursts = "" if shape in (None, 1.0) else f", burstiness {shape:g}"
        return f"rate({self.settings.rate:g}/s{bursts})"
