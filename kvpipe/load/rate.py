"""load=rate: open-loop arrivals at R requests per second, a Poisson process with a seed (vLLM's
--request-rate, GuideLLM's poisson profile), for load.requests requests or for load.duration_s
seconds; or, where the workload's requests carry their own arrival times (workload=dataset with a
timestamp or arrival_s column), those, replayed. A request waits while the server is busy: its
queueing delay counts in its TTFT."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Optional

from kvpipe.errors import ConfigError
from kvpipe.load.base import Load


class Rate(Load):
    name = "rate"
    order = 30
    replays_arrivals = True  # a dataset's timestamps, where it has them, in place of the Poisson draw

    @dataclass
    class Settings:
        rate: float = 1.0  # requests per second, on average
        duration_s: Optional[float] = None  # arrivals for this long instead of load.requests
        seed: int = 0  # the arrival times' seed: the same seed, the same times

    def check(self) -> None:
        super().check()
        if not (self.settings.rate > 0 and math.isfinite(self.settings.rate)):
            raise ConfigError("load.rate", self.settings.rate, "expected requests per second above 0, e.g. 2.5")
        if self.settings.duration_s is not None:
            if not self.settings.duration_s > 0:
                raise ConfigError("load.duration_s", self.settings.duration_s, "expected seconds above 0, or null")
            if self.config.requests is not None:
                raise ConfigError(
                    "load.duration_s", self.settings.duration_s, "give load.requests or load.duration_s, not both"
                )

    def request_count(self, prompts: int) -> int:
        if self.settings.duration_s is None:
            return super().request_count(prompts)
        return len(self._times(lambda times: times[-1] >= self.settings.duration_s)) - 1 or 1

    def arrivals(self, count: int) -> list[float]:
        return self._times(lambda times: len(times) >= count)[:count]

    def _times(self, enough) -> list[float]:
        """Exponential gaps of mean 1/rate from the seed, the first request at 0, until enough."""
        draw, times = random.Random(self.settings.seed), [0.0]
        while not enough(times):
            times.append(times[-1] + draw.expovariate(self.settings.rate))
        return times

    def label(self) -> str:
        return f"rate({self.settings.rate:g}/s)"
