"""Timers for one generate() call, and the statistics over calls.

Per-token timestamps come from a streamer hook that generate() calls once per step; it reads
a clock (after a CUDA synchronise) and nothing else, so it does not slow what it measures.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass


class TokenClock:
    """A transformers streamer that timestamps every decoding step."""

    def __init__(self, sync_cuda: bool):
        self._sync = sync_cuda
        self.start_s = 0.0
        self.step_s: list[float] = []  # one per generated token position (step), prompt excluded
        self.end_s = 0.0
        self._saw_prompt = False

    def _now(self) -> float:
        if self._sync:
            import torch

            torch.cuda.synchronize()
        return time.perf_counter()

    def now(self) -> float:
        """A reading of this clock: seconds, after the device has finished what it was given."""
        return self._now()

    def begin(self) -> None:
        self.start_s = self._now()
        self.step_s.clear()
        self._saw_prompt = False

    def put(self, value) -> None:  # generate() first puts the prompt, then each new token
        if not self._saw_prompt:
            self._saw_prompt = True
            return
        self.step_s.append(self._now())

    def end(self) -> None:
        self.end_s = self._now()


@dataclass
class Timing:
    """Latencies of one generate() call, in milliseconds."""

    ttft_ms: float
    e2e_ms: float
    itl_ms: list[float]  # inter-token latencies after the first token
    steps: int

    @classmethod
    def from_clock(cls, clock: TokenClock) -> "Timing":
        steps = clock.step_s
        itl = [(b - a) * 1e3 for a, b in zip(steps, steps[1:])]
        return cls(
            ttft_ms=(steps[0] - clock.start_s) * 1e3,
            e2e_ms=(clock.end_s - clock.start_s) * 1e3,
            itl_ms=itl,
            steps=len(steps),
        )

    @property
    def tpot_ms(self) -> float:
        return statistics.fmean(self.itl_ms) if self.itl_ms else float("nan")


def percentile(values: list[float], q: float) -> float:
    """Linear-interpolated percentile (numpy's default), without numpy."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100
    low = int(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def mean_std(values: list[float]) -> tuple[float, float]:
    if not values:
        return float("nan"), float("nan")
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)
