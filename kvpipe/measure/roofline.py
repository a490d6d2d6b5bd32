"""The memory roofline: bytes a decode step reads, over the bandwidth this device can copy at; and
the matmul throughput this device reaches, for the compute side of `kvpipe plan --hardware local`."""

from __future__ import annotations

import time
from pathlib import Path

from kvpipe.units import MIB, SIZE_UNITS

_BANDWIDTH: dict[str, float] = {}
_MATMUL: dict[tuple[str, str], float] = {}


def best_seconds(operation, device: str, trials: int) -> float:
    """The fastest of `trials` runs of operation(), each timed to its end (CUDA: synchronized)."""
    import torch

    best = float("inf")
    for _ in range(trials):
        if device == "cuda":
            torch.cuda.synchronize()
        started = time.perf_counter()
        operation()
        if device == "cuda":
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - started)
    return best


def memory_bandwidth_bytes_per_s(device: str, size_bytes: int | None = None, trials: int = 5) -> float:
    """Best-of-N large tensor copy on this device, counting bytes read plus bytes written.
    Measured once per process and device."""
    if device not in _BANDWIDTH:
        import torch

        size_bytes = size_bytes or probe_bytes(device)
        # Never zeros (untouched zero pages would be read from one shared page); arange writes every
        # page in a third of uniform_'s time (0.09 s against 0.28 s on 2 cores), at the same bandwidth.
        src = torch.arange(size_bytes // 4, dtype=torch.float32, device=device)
        dst = torch.empty_like(src)
        dst.copy_(src)  # warm-up: page in both buffers
        _BANDWIDTH[device] = 2 * size_bytes / best_seconds(lambda: dst.copy_(src), device, trials)
        del src, dst
    return _BANDWIDTH[device]


def probe_bytes(device: str) -> int:
    """Each of the copy's two buffers: twice the CPU's last-level caches (so that the copy's bytes
    are four times what they hold, and come from memory), at least 64 MiB and at most 1 GiB; 256 MiB
    where the caches are not known, and on a GPU (whose L2 is at most 60 MiB on an H200). On this
    2-core VM, with 32 MiB of L3: 64 MiB, which reads 34 GB/s in 0.08 s, as 256 MiB does in 0.29 s."""
    caches = last_level_cache_bytes() if device == "cpu" else 0
    return min(max(2 * caches, 64 * MIB), 1024 * MIB) if caches else 256 * MIB


def last_level_cache_bytes(root: Path = Path("/sys/devices/system/cpu")) -> int:
    """The bytes of the highest-level CPU caches, each shared cache counted once (Linux sysfs); 0
    where sysfs does not say."""
    caches: dict[int, dict[str, int]] = {}  # level -> {the CPUs sharing it: bytes}
    for index in root.glob("cpu[0-9]*/cache/index[0-9]*"):
        try:
            level = int((index / "level").read_text())
            size = (index / "size").read_text().strip()  # "32768K"
            shared = (index / "shared_cpu_list").read_text().strip()
            unit = f"{size[-1].lower()}ib" if size[-1:].isalpha() else ""  # K: KiB, as Linux writes it
            size_bytes = int(size.rstrip("KMG")) * SIZE_UNITS[unit]
        except (OSError, ValueError):
            continue
        caches.setdefault(level, {})[shared] = size_bytes
    return sum(caches[max(caches)].values()) if caches else 0


def roofline_fraction(bytes_per_step: float, steps_per_s: float, bandwidth_bytes_per_s: float) -> float:
    """Each decode step reads `bytes_per_step`; at `steps_per_s` that is this fraction of the bandwidth."""
    return bytes_per_step * steps_per_s / bandwidth_bytes_per_s


def weights_read_bytes(weights_bytes: int, input_embedding_bytes: int, embedding_row_bytes: int, tied: bool,
                       rows: int) -> int:  # fmt: skip
    """Weight bytes one forward pass over `rows` tokens reads: every weight once, except untied input
    embeddings, of which each token reads its one row (tied ones are read whole by the output head)."""
    if tied or not input_embedding_bytes:
        return weights_bytes
    return weights_bytes - input_embedding_bytes + min(rows * embedding_row_bytes, input_embedding_bytes)


def matmul_flops_per_s(device: str, dtype: str = "float32", trials: int = 5) -> float:
    """Best-of-N square matmul in `dtype` on this device, with torch's threads as they are set (a
    run sets them first: kvpipe.job.threads.use_threads). Measured once per process, device and dtype:
    the local peak a TTFT floor divides FLOPs by, in place of a datasheet's."""
    key = (device, dtype)
    if key not in _MATMUL:
        import torch

        size = 4096 if device == "cuda" else 1024  # a GPU needs a large product to reach its peak
        a = torch.randn(size, size, device=device).to(getattr(torch, dtype))
        b = torch.randn(size, size, device=device).to(getattr(torch, dtype))
        torch.matmul(a, b)  # warm-up: kernels chosen, pages touched
        _MATMUL[key] = 2 * size**3 / best_seconds(lambda: torch.matmul(a, b), device, trials)
        del a, b
    return _MATMUL[key]
