"""The memory roofline: bytes a decode step reads, over the bandwidth this device can copy at."""

from __future__ import annotations

import time

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


def roofline_fraction(bytes_per_step: float, steps_per_s: float, bandwidth_bytes_per_s: float) -> float:
    """Each decode step reads `bytes_per_step`; at `steps_per_s` that is this fraction of the bandwidth."""
    return bytes_per_step * steps_per_s / bandwidth_bytes_per_s
