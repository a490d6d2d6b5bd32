"""A Ray cluster on this machine, for tests/test_ray.py and benchmarks/ray_pairing.py: `ray start --head`
on loopback, its session in a folder of its own, and every process of it stopped afterwards."""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import psutil

RAY = Path(sys.executable).parent / "ray"
FOLDER_PREFIX = "kvray"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def ray_cluster(cpus: int = 2):
    """A Ray head on loopback with `cpus` CPU slots, its session in a short temporary folder (Ray's socket
    paths must fit 107 bytes); yields its address. Afterwards every process of this cluster (those
    naming its folder, and their children) is stopped: `ray stop` would stop every cluster of the user's."""
    folder = tempfile.mkdtemp(prefix=FOLDER_PREFIX, dir="/tmp")
    port = free_port()
    ports = [f"--dashboard-port={free_port()}"]
    command = [str(RAY), "start", "--head", "--node-ip-address=127.0.0.1", f"--port={port}", f"--num-cpus={cpus}",
               "--include-dashboard=false", "--disable-usage-stats", f"--temp-dir={folder}", *ports]  # fmt: skip
    try:
        started = subprocess.run(command, cwd=folder, capture_output=True, text=True, timeout=120)
        if started.returncode != 0:
            raise RuntimeError(f"ray start failed:\n{(started.stdout + started.stderr)[-3000:]}")
        yield f"127.0.0.1:{port}"
    finally:
        stop_cluster(folder)


def stop_cluster(folder: str) -> None:
    found = {}
    for proc in psutil.process_iter(["cmdline"]):
        with contextlib.suppress(psutil.Error):
            if any(folder in part for part in proc.info["cmdline"] or []):
                found[proc.pid] = proc
                found.update({child.pid: child for child in proc.children(recursive=True)})
    for proc in found.values():
        with contextlib.suppress(psutil.Error):
            proc.terminate()
    # Ray's GCS server and autoscaler monitor outlive SIGTERM (`ray stop` waits 16 s for them, then kills):
    # a few seconds for the rest to end cleanly, then SIGKILL
    _, alive = psutil.wait_procs(list(found.values()), timeout=3)
    for proc in alive:
        with contextlib.suppress(psutil.Error):
            proc.kill()
    psutil.wait_procs(alive, timeout=15)
    shutil.rmtree(folder, ignore_errors=True)
