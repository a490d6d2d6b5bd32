"""Peak memory during a block, and returning freed memory before the next one."""

from __future__ import annotations

import gc
import re
import threading
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class PeakMemory:
    """Peak memory during a block, absolute (weights included) on every device, and the state just
    before the block, so that the growth (cache plus activations) is known too.

    CUDA: the allocator's peak allocated (and reserved) bytes after resetting its statistics. CPU:
    the process's peak resident set, from the kernel's high-water mark (reset to the current RSS
    through /proc/self/clear_refs) or, where that is not writable, a 2 ms RSS sampler."""

    device: str
    peak_bytes: int = 0
    baseline_bytes: int = 0
    peak_reserved_bytes: int | None = None
    source: str = ""
    _sampler: "_RssSampler | None" = field(default=None, repr=False)

    @property
    def peak_over_baseline_bytes(self) -> int:
        """What the block added at its peak over the state just before it."""
        return max(0, self.peak_bytes - self.baseline_bytes)

    def __enter__(self) -> "PeakMemory":
        if self.device == "cuda":
            import torch

            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self.baseline_bytes = int(torch.cuda.memory_allocated())
            self.source = "cuda_max_memory_allocated"
        else:
            self.baseline_bytes = _rss_bytes()
            if _reset_high_water_mark():
                self.source = "linux_vmhwm"
            else:
                self._sampler = _RssSampler()
                self._sampler.start()
                self.source = "rss_sampler"
        return self

    def __exit__(self, *exc) -> None:
        if self.device == "cuda":
            import torch

            torch.cuda.synchronize()
            self.peak_bytes = int(torch.cuda.max_memory_allocated())
            self.peak_reserved_bytes = int(torch.cuda.max_memory_reserved())
        elif self._sampler is not None:
            self.peak_bytes = self._sampler.stop()
        else:
            self.peak_bytes = max(_high_water_mark_bytes(), self.baseline_bytes)


_STATUS = Path("/proc/self/status")


def _status_kib(name: str, pid: int | str = "self") -> int:
    match = re.search(rf"^{name}:\s+(\d+) kB", Path(f"/proc/{pid}/status").read_text(), re.MULTILINE)
    return int(match.group(1)) if match else 0


def _rss_bytes() -> int:
    if _STATUS.exists():
        return _status_kib("VmRSS") * 1024
    import psutil

    return psutil.Process().memory_info().rss


def _high_water_mark_bytes(pid: int | str = "self") -> int:
    return _status_kib("VmHWM", pid) * 1024


def _reset_high_water_mark(pid: int | str = "self") -> bool:
    """Linux resets VmHWM to the current RSS when '5' is written to clear_refs."""
    try:
        Path(f"/proc/{pid}/clear_refs").write_text("5")
    except OSError:
        return False
    return _high_water_mark_bytes(pid) > 0


def reset_peak_of(pid: int) -> int:
    """Another process's (a child's: an engine's server) peak resident set reset to its current one
    (Linux's clear_refs); its resident bytes then."""
    _reset_high_water_mark(pid)
    return _status_kib("VmRSS", pid) * 1024


def peak_of(pid: int) -> int:
    """Another process's peak resident set since it was last reset (Linux's VmHWM), in bytes."""
    return _high_water_mark_bytes(pid)


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


def freeze_long_lived_objects() -> None:
    """Move what is alive now (modules, classes, the loaded model) out of the collector's reach, so
    that the collection before each measured call walks only what was made since. With torch,
    transformers and mlflow imported, a full collection walks ~500,000 objects: 3 s a call on 2
    cores, longer than many calls it precedes. Garbage made afterwards is collected as before."""
    gc.collect()
    gc.freeze()


def release_freed_memory(device: str) -> None:
    """Return freed memory to the OS, so one call's peak does not hide inside the last one's."""
    gc.collect()
    if device == "cuda":
        import torch

        torch.cuda.empty_cache()
        return
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass
