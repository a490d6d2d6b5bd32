"""Timers and memory probes for one generate() call.

Per-token timestamps come from a streamer hook that generate() calls once per step; it reads
a clock (after a CUDA synchronise) and nothing else, so it does not slow what it measures.
"""

from __future__ import annotations

import re
import statistics
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path


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
        return cls(ttft_ms=(steps[0] - clock.start_s) * 1e3, e2e_ms=(clock.end_s - clock.start_s) * 1e3,
                   itl_ms=itl, steps=len(steps))

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


# ---- memory -----------------------------------------------------------------------------


@dataclass
class PeakMemory:
    """Peak memory during a block. On CUDA: the allocator's peak allocated and reserved bytes
    (absolute, weights included). On CPU: peak resident-set growth over the block, from the
    kernel's high-water mark (reset through /proc/self/clear_refs) or, failing that, a sampler."""

    device: str
    peak_bytes: int = 0
    peak_reserved_bytes: int | None = None
    source: str = ""
    _baseline: int = 0
    _sampler: "_RssSampler | None" = field(default=None, repr=False)

    def __enter__(self) -> "PeakMemory":
        if self.device == "cuda":
            import torch

            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self.source = "cuda_max_memory_allocated"
        else:
            self._baseline = _rss_bytes()
            if _reset_high_water_mark():
                self.source = "linux_vmhwm_growth"
            else:
                self._sampler = _RssSampler()
                self._sampler.start()
                self.source = "rss_sampler_growth"
        return self

    def __exit__(self, *exc) -> None:
        if self.device == "cuda":
            import torch

            torch.cuda.synchronize()
            self.peak_bytes = int(torch.cuda.max_memory_allocated())
            self.peak_reserved_bytes = int(torch.cuda.max_memory_reserved())
        elif self._sampler is not None:
            self.peak_bytes = max(0, self._sampler.stop() - self._baseline)
        else:
            self.peak_bytes = max(0, _high_water_mark_bytes() - self._baseline)


_STATUS = Path("/proc/self/status")


def _status_kib(name: str) -> int:
    match = re.search(rf"^{name}:\s+(\d+) kB", _STATUS.read_text(), re.MULTILINE)
    return int(match.group(1)) if match else 0


def _rss_bytes() -> int:
    if _STATUS.exists():
        return _status_kib("VmRSS") * 1024
    import psutil

    return psutil.Process().memory_info().rss


def _high_water_mark_bytes() -> int:
    return _status_kib("VmHWM") * 1024


def _reset_high_water_mark() -> bool:
    """Linux resets VmHWM to the current RSS when '5' is written to clear_refs."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return _high_water_mark_bytes() > 0


class _RssSampler:
    """Fallback where clear_refs is not writable: RSS every 2 ms, sleeping in between."""

    def __init__(self, interval_s: float = 0.002):
        self._interval = interval_s
        self._stop = threading.Event()
        self._peak = 0
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self._peak = max(self._peak, _rss_bytes())
            self._stop.wait(self._interval)

    def start(self) -> None:
        self._peak = _rss_bytes()
        self._thread.start()

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return max(self._peak, _rss_bytes())


# ---- memory bandwidth, for the roofline ---------------------------------------------------

_BANDWIDTH: dict[str, float] = {}


def memory_bandwidth_bytes_per_s(device: str, size_bytes: int = 256 * 2**20, trials: int = 5) -> float:
    """Best-of-N large tensor copy on this device, counting bytes read plus bytes written.
    Measured once per process and device."""
    if device not in _BANDWIDTH:
        import torch

        src = torch.empty(size_bytes // 4, dtype=torch.float32, device=device).uniform_()  # never zeros
        dst = torch.empty_like(src)
        dst.copy_(src)  # warm-up: page in both buffers
        best = float("inf")
        for _ in range(trials):
            if device == "cuda":
                torch.cuda.synchronize()
            started = time.perf_counter()
            dst.copy_(src)
            if device == "cuda":
                torch.cuda.synchronize()
            best = min(best, time.perf_counter() - started)
        _BANDWIDTH[device] = 2 * size_bytes / best
        del src, dst
    return _BANDWIDTH[device]
