"""Beyond one process: Hydra's submitit and joblib launchers, and a real MLflow server.

Each launcher runs once: submitit (`local`) against the launch dir's SQLite store, joblib (`parallel`)
against a tracking server started with `make mlflow-server`. Both run their jobs side by side, so
both stores take concurrent writers (see also test_resilience's two concurrent jobs)."""

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
    "cache=dynamic,quantized",  # two jobs side by side: each launcher process imports torch and transformers
    "backend=hqq",  # the backend does not matter here; quanto JIT-loads a C++ extension in each new process
]


def runs_under_one_parent(uri: str) -> tuple:
    import mlflow

    mlflow.set_tracking_uri(uri)
    runs = mlflow.search_runs(experiment_names=["kvpipe"], output_format="list")
    parents = [r for r in runs if r.data.tags.get("kvpipe.sweep") == "true"]
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId")]
    return parents, children


def assert_every_child_under_one_parent(uri: str) -> None:
    parents, children = runs_under_one_parent(uri)
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    statuses = [(c.info.run_name, c.info.status, c.data.tags.get("kvpipe.status")) for c in children]
    assert len(children) == 2 and all(c.info.status == "FINISHED" for c in children), statuses
    assert {c.data.tags["mlflow.parentRunId"] for c in children} == {parents[0].info.run_id}


def test_multirun_with_a_process_launcher_lands_every_child_under_one_parent(tmp_path, existing_store):
    existing_store(tmp_path)
    proc = run_cli(["-m", "hydra/launcher=local", *TINY], cwd=tmp_path, timeout=600)  # submitit, this machine
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    assert_every_child_under_one_parent(f"sqlite:///{tmp_path}/outputs/mlflow.db")


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
    proc = run_cli(  # joblib, two workers
        ["-m", "hydra/launcher=parallel", "tracking=server", f"tracking.uri={mlflow_server}", *TINY],
        cwd=tmp_path,
        timeout=600,
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    assert_every_child_under_one_parent(mlflow_server)
    assert not (tmp_path / "outputs" / "mlflow.db").exists()  # nothing went to the local store
