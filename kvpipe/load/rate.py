"""load=rate: open-loop arrivals at R requests per second from a seed (vLLM's --request-rate and
--burstiness, GuideLLM's poisson profile), for load.requests requests or for load.duration_s seconds.
The gaps between arrivals are exponential (a Poisson process), or with load.burstiness gamma-distributed
with the same mean: below 1 burstier, above 1 steadier, 1 Poisson (vLLM's definition). A request waits
while the server is busy: its queueing delay counts in its TTFT. A workload's own arrival times are
load=replay's; this load draws its own, whatever the workload carries.

load.ramp_up_s = T (GuideLLM's and k6's ramp) lets the rate rise linearly from 0 to R over the first T
seconds and then hold: rate(t) = R t / T for t < T, R after. The arrivals are the unramped ones
(the same seeded gaps, s_0 = 0, s_1, ...) carried through the inverse of the integrated rate over R,
S(t) = t² / 2T for t <= T, t - T/2 after: t = sqrt(2 T s) for s <= T/2, s + T/2 after. A Poisson
process stays Poisson (now non-homogeneous, of that rate), a gamma one keeps its shape in the warped
time; after the ramp every gap is the unramped one, so the rate is R again, and T = 0 (or null) leaves
every arrival where it was. The ramp must end within the run: before load.duration_s, and before the
last of load.requests arrives (else the rate never reaches R)."""

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
    # Poisson and no ramp, as every rate run before burstiness and ramp_up_s was
    late_defaults = {"burstiness": 1.0, "ramp_up_s": 0.0}
    test_overrides = ("load.rate=50",)  # arrivals 20 ms apart on average: a quick run

    @dataclass
    class Settings:
        rate: float = 1.0  # requests per second, on average
        duration_s: Optional[float] = None  # arrivals for this long instead of load.requests
        seed: int = 0  # the arrival times' seed: the same seed, the same times
        burstiness: Optional[float] = None  # the gaps' gamma shape; null (or 1): Poisson
        ramp_up_s: Optional[float] = None  # the rate rises linearly from 0 to load.rate over it; null (or 0): none

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
        duration = self.settings.duration_s
        if duration is not None:
            if not duration > 0:
                raise ConfigError("load.duration_s", duration, "expected seconds above 0, or null")
            if self.config.requests is not None:
                raise ConfigError("load.duration_s", duration, "give load.requests or load.duration_s, not both")
        ramp = self.settings.ramp_up_s
        if ramp is not None and not (ramp >= 0 and math.isfinite(ramp)):
            raise ConfigError("load.ramp_up_s", ramp, "expected seconds of 0 or more (0 or null: no ramp), e.g. 10")
        if ramp and duration is not None and ramp > duration:
            raise ConfigError(
                "load.ramp_up_s",
                ramp,
                f"expected at most load.duration_s={duration:g}: the ramp must end within the run",
            )
        if ramp and self.config.requests is not None:  # known here; else once the workload's prompts are
            self._check_ramp_ends(self._times(lambda times: len(times) >= self.config.requests))

    def requests(self, prompts) -> list:
        if self.settings.duration_s is None:
            return super().requests(prompts)
        arrived = len(self._times(lambda times: times[-1] >= self.settings.duration_s)) - 1
        return cycled(prompts, arrived or 1)

    def arrivals(self, requests) -> list[float]:
        times = self._times(lambda times: len(times) >= len(requests))[: len(requests)]
        if self.settings.duration_s is None:
            self._check_ramp_ends(times)
        return times

    def _check_ramp_ends(self, times: list[float]) -> None:
        """A ramp still rising at the last arrival never reaches the rate: the run is all ramp."""
        ramp = self.settings.ramp_up_s
        if ramp and times[-1] <= ramp:
            raise ConfigError(
                "load.ramp_up_s", ramp,
                f"all {len(times)} requests would arrive within the ramp (the last at {times[-1]:.3g} s), so the rate "
                "never reaches load.rate; expected a ramp that ends before the last arrival: a shorter one, more "
                "load.requests, or load.duration_s",
            )  # fmt: skip

    def _times(self, enough) -> list[float]:
        """Gaps of mean 1/rate from the seed, the first request at 0, warped by the ramp, until enough."""
        draw, unramped, times = random.Random(self.settings.seed), [0.0], [0.0]
        while not enough(times):
            unramped.append(unramped[-1] + self._gap(draw))
            times.append(self._ramped(unramped[-1]))
        return times

    def _ramped(self, unramped_s: float) -> float:
        """When an arrival due at unramped_s at the full rate comes under the ramp (see the module's doc)."""
        ramp = self.settings.ramp_up_s
        if not ramp:
            return unramped_s
        return math.sqrt(2.0 * ramp * unramped_s) if unramped_s <= ramp / 2 else unramped_s + ramp / 2

    def _gap(self, draw: random.Random) -> float:
        shape = self.settings.burstiness
        if shape in (None, 1.0):  # exponential: the draws every Poisson run made
            return draw.expovariate(self.settings.rate)
        return draw.gammavariate(shape, 1.0 / (self.settings.rate * shape))

    def label(self) -> str:
        shape, ramp = self.settings.burstiness, self.settings.ramp_up_s
        bursts = "" if shape in (None, 1.0) else f", burstiness {shape:g}"
        ramped = f", ramp {ramp:g}s" if ramp else ""
        return f"rate({self.settings.rate:g}/s{bursts}{ramped})"
