"""Beyond one process: Hydra's joblib and submitit launchers, and a real MLflow server."""

from __future__ import annotations

import socket
import subprocess
import time
import urllib.request

import pytest

from conftest import REPO, run_cli

pytestmark = pytest.mark.slow  # each starts several Python processes

TINY = [
    "model=tiny_random",
    "workload.max_new_tokens=3",
    "workload.warmup=0",
    "quality=off",
    "workload.prompts=[Hi.]",
    "cache=dynamic,static,quantized",
]


def runs_under_one_parent(uri: str) -> tuple:
    import mlflow

    mlflow.set_tracking_uri(uri)
    runs = mlflow.search_runs(experiment_names=["kvpipe"], output_format="list")
    parents = [r for r in runs if r.data.tags.get("kvpipe.sweep") == "true"]
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId")]
    return parents, children


@pytest.mark.parametrize("launcher", ["parallel", "local"])  # joblib with 2 workers; submitit on this machine
def test_multirun_with_a_process_launcher_lands_every_child_under_one_parent(launcher, tmp_path):
    proc = run_cli(["-m", f"hydra/launcher={launcher}", *TINY], cwd=tmp_path, timeout=600)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    parents, children = runs_under_one_parent(f"sqlite:///{tmp_path}/outputs/mlflow.db")
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    assert len(children) == 3
    assert {c.data.tags["mlflow.parentRunId"] for c in children} == {parents[0].info.run_id}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def mlflow_server(tmp_path):
    """`make mlflow-server` on loopback, with its store in tmp_path; stopped after the test."""
    port = free_port()
    server = subprocess.Popen(
        ["make", "-s", "-C", str(REPO), "mlflow-server", f"MLFLOW_PORT={port}", f"MLFLOW_DIR={tmp_path}/server"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while True:
        try:
            urllib.request.urlopen(url + "/health", timeout=2).close()
            break
        except OSError:
            assert time.monotonic() < deadline and server.poll() is None, "mlflow server did not start"
            time.sleep(0.5)
    yield url
    import os
    import signal

    os.killpg(server.pid, signal.SIGTERM)
    server.wait(timeout=30)


def test_parallel_sweep_against_a_real_tracking_server(mlflow_server, tmp_path):
    proc = run_cli(
        ["-m", "hydra/launcher=parallel", "tracking=server", f"tracking.uri={mlflow_server}", *TINY],
        cwd=tmp_path,
        timeout=600,
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    parents, children = runs_under_one_parent(mlflow_server)
    assert len(parents) == 1 and len(children) == 3
    assert all(c.info.status == "FINISHED" for c in children)
    assert not (tmp_path / "outputs" / "mlflow.db").exists()  # nothing went to the local store
