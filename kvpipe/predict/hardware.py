"""Accelerators as data, for `kvpipe plan --hardware NAME`: conf/hardware.yaml holds, per accelerator,
its memory, memory bandwidth and peak dense throughput per dtype, as its vendor's datasheet gives them,
with the document each figure comes from, and where an entry gives one, the host memory beside one
such accelerator (`host_memory_gb`: the vendor's reference system's RAM over its accelerators, what an
offloaded cache's layers live in). A new accelerator is one more entry. One file rather than a
folder of them: Hydra would offer a folder under conf/ as a config group that no job can select.

`--hardware local` is this machine instead, measured as runs measure it: the bandwidth of a large
copy (kvpipe.measure.roofline, the figure every run's roofline_fraction divides by) and the
throughput of a square matmul in the model dtype, both with the torch threads a run would use.
"""

from __future__ import annotations

import functools
import importlib.resources
from dataclasses import asdict, dataclass

from kvpipe.errors import ConfigError, KvpipeError, require_choice

LOCAL = "local"
FIELDS = ("name", "title", "device", "memory_gb", "memory_bandwidth_gb_per_s", "peak_dense_tflops", "sources")
HOST_MEMORY = "host_memory_gb"  # optional: an entry without it leaves host memory to --host-memory


@dataclass(frozen=True)
class Hardware:
    name: str
    title: str
    device: str  # where kvpipe runs on it: cuda (ROCm's torch drives AMD GPUs as cuda too) or cpu
    memory_bytes: int
    memory_bandwidth_bytes_per_s: float
    peak_dense_flops_per_s: dict[str, float]  # by model dtype: dense, never the sparsity figure
    sources: dict[str, str]  # figure -> the document it comes from, or how it was measured
    device_names: tuple[str, ...] = ()  # what torch.cuda.get_device_name() says on one
    measured: bool = False  # `local`: the figures are this machine's, measured now
    host_memory_bytes: int | None = None  # host RAM per accelerator, where the entry gives it

    def peak_flops(self, dtype: str) -> float:
        if dtype not in self.peak_dense_flops_per_s:
            raise KvpipeError(
                f"--hardware {self.name} gives no peak throughput for {dtype}; it gives "
                f"{', '.join(self.peak_dense_flops_per_s)} (set model.dtype to one of them)"
            )
        return self.peak_dense_flops_per_s[dtype]

    def specs_text(self, dtype: str) -> str:
        """'NVIDIA H100 SXM 80GB · 80.0 GB · 3,350 GB/s · 989.4 TFLOPS dense bfloat16'."""
        return (
            f"{self.title} · {self.memory_bytes / 1e9:.1f} GB · {self.memory_bandwidth_bytes_per_s / 1e9:,.0f} GB/s · "
            f"{self.peak_flops(dtype) / 1e12:.4g} TFLOPS dense {dtype}"
        )

    def as_dict(self) -> dict:
        data = asdict(self)
        data["device_names"] = list(self.device_names)
        return data


TABLE = "hardware.yaml"


@functools.cache
def _table() -> dict:
    import yaml

    return yaml.safe_load((importlib.resources.files("kvpipe.conf") / TABLE).read_text())


def names() -> tuple[str, ...]:
    """The table's accelerators, then `local`."""
    return (*sorted(_table()), LOCAL)


def get(name: str) -> Hardware:
    """An accelerator of the table by name (not `local`: see `local`)."""
    require_choice("--hardware", name, names())
    return _read(name)


def table() -> list[Hardware]:
    return [_read(name) for name in names() if name != LOCAL]


def for_device_name(device_name: str) -> Hardware | None:
    """The table's entry for a GPU as torch names it ('NVIDIA H100 80GB HBM3'), or None."""
    wanted = device_name.strip().lower()
    return next((hw for hw in table() if wanted in (n.lower() for n in hw.device_names)), None)


def _read(name: str) -> Hardware:
    data = _table()[name]
    where = f"conf/{TABLE}: {name}"
    missing = [key for key in FIELDS if not isinstance(data, dict) or key not in data]
    if missing:
        raise KvpipeError(f"{where} lacks {', '.join(missing)}; each accelerator gives {', '.join(FIELDS)}")
    peaks = data["peak_dense_tflops"]
    host = data.get(HOST_MEMORY)
    figures = {"memory_gb": data["memory_gb"], "memory_bandwidth_gb_per_s": data["memory_bandwidth_gb_per_s"],
               **{f"peak_dense_tflops.{dtype}": value for dtype, value in peaks.items()},
               **({HOST_MEMORY: host} if host is not None else {})}  # fmt: skip
    for key, value in figures.items():
        if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0:
            raise ConfigError(f"{where}: {key}", value, "expected a positive number")
    sourced = (*FIELDS[3:6], *((HOST_MEMORY,) if host is not None else ()))
    unsourced = [key for key in sourced if not data["sources"].get(key)]
    if unsourced:
        raise KvpipeError(f"{where} gives no source for {', '.join(unsourced)}; every figure names its datasheet")
    return Hardware(
        name=data["name"],
        title=data["title"],
        device=data["device"],
        memory_bytes=int(data["memory_gb"] * 1e9),  # GB as datasheets count them: 10^9 bytes
        memory_bandwidth_bytes_per_s=data["memory_bandwidth_gb_per_s"] * 1e9,
        peak_dense_flops_per_s={dtype: value * 1e12 for dtype, value in peaks.items()},
        sources=dict(data["sources"]),
        device_names=tuple(data.get("device_names") or ()),
        host_memory_bytes=None if host is None else int(host * 1e9),
    )


def device_memory(device: str) -> tuple[int, str]:
    """The device's whole memory in bytes, and where it was read: the GPU's, or all of RAM."""
    if device == "cuda":
        import torch

        return int(torch.cuda.get_device_properties(0).total_memory), "torch.cuda.get_device_properties(0).total_memory"
    import psutil

    return int(psutil.virtual_memory().total), "psutil.virtual_memory().total (all of RAM)"


def local(device: str, dtype: str) -> Hardware:
    """This machine, measured now with torch's threads as they are set (set them as a run would
    first: kvpipe.job.threads.use_threads)."""
    import socket

    import torch

    from kvpipe.measure.roofline import matmul_flops_per_s, memory_bandwidth_bytes_per_s

    memory, memory_source = device_memory(device)
    ram, ram_source = device_memory("cpu")  # the host's, which an offloaded cache fills
    if device == "cuda":
        title = torch.cuda.get_device_name()
    else:
        title = f"{socket.gethostname()}, cpu, {torch.get_num_threads()} torch threads"
    bandwidth = memory_bandwidth_bytes_per_s(device)
    flops = matmul_flops_per_s(device, dtype)
    return Hardware(
        name=LOCAL,
        title=f"this machine ({title})",
        device=device,
        memory_bytes=int(memory),
        memory_bandwidth_bytes_per_s=bandwidth,
        peak_dense_flops_per_s={dtype: flops},
        sources={
            "memory_gb": memory_source,
            "memory_bandwidth_gb_per_s": "measured: the best of 5 copies of 256 MiB, bytes read plus written "
            "(kvpipe.measure.roofline, as every run measures memory_bandwidth_bytes_per_s)",
            "peak_dense_tflops": f"measured: the best of 5 square {dtype} matmuls (kvpipe.measure.roofline)",
            **({HOST_MEMORY: ram_source} if device == "cuda" else {}),
        },
        measured=True,
        host_memory_bytes=int(ram) if device == "cuda" else None,  # off CUDA nothing is offloaded
    )
