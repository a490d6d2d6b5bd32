"""Where a run ran: the machine, its load, and the versions that shaped its numbers.

Tagged on every run, so that results from two machines (or a loaded one) are never compared
without a word: compare flags a table whose runs differ in `ENVIRONMENT_TAGS`.
"""

from __future__ import annotations

import os
import platform
import re
import socket
import subprocess
from functools import lru_cache
from pathlib import Path

from kvpipe import __version__

# The tags that make two runs' figures comparable only when they are equal.
ENVIRONMENT_TAGS = ("host", "cpu_model", "gpu_name", "torch_version", "transformers_version", "torch_threads")


def environment(device: str) -> dict[str, str]:
    """Tags: host, CPU model and physical cores, torch threads, GPU name, CUDA and driver versions
    (on CUDA), and the torch, transformers, kvpipe and Python versions."""
    import torch
    import transformers

    tags = {
        "host": socket.gethostname(),
        "cpu_model": _cpu_model(),
        "physical_cores": str(physical_cores()),
        "torch_threads": str(torch.get_num_threads()),
        "torch_version": str(torch.__version__),  # a plain str: TorchVersion would make its readers import torch
        "transformers_version": transformers.__version__,
        "kvpipe_version": __version__,
        "python_version": platform.python_version(),  # its pydoc pages are the long_context and passkey text
    }
    if device == "cuda":
        tags["gpu_name"] = torch.cuda.get_device_name()
        tags["cuda_version"] = str(torch.version.cuda)
        driver = _nvidia_driver()
        if driver:
            tags["nvidia_driver_version"] = driver
    return tags


def load_average() -> float:
    """The 1-minute load average: runnable processes competing for the cores (Unix)."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return float("nan")


@lru_cache(maxsize=1)
def _cpu_model() -> str:
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        match = re.search(r"^model name\s*:\s*(.+)$", cpuinfo.read_text(), re.MULTILINE)
        if match:
            return match.group(1).strip()
    return platform.processor() or platform.machine()


def physical_cores() -> int:
    import psutil

    return psutil.cpu_count(logical=False) or psutil.cpu_count() or 0


@lru_cache(maxsize=1)
def _nvidia_driver() -> str | None:
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=10, check=True,
        )  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip().splitlines()[0] if out.stdout.strip() else None
