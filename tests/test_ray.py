"""Beyond one machine: a real Ray cluster (`ray start --head` on loopback, two worker slots) runs a
kvpipe sweep through hydra/launcher=ray_cluster against a shared MLflow server; the driver is killed
mid-sweep and the sweep resumed, and every job lands exactly once under one parent, each paired on its
node with its own copy of the baseline. The cluster is stopped whatever happens.

Needs the Ray launcher (`make ray`, which CI runs); skipped where it is not installed."""

from __future__ import annotations

import psutil
import pytest
from ray_cluster import FOLDER_PREFIX, ray_cluster
from test_launchers import (
    assert_paired_on_node,
    finished_children,
    killed_once_a_job_is_recorded,
    runs_under_one_parent,
)
from test_resilience import wait_for

from conftest import mlflow_server, run_cli

pytest.importorskip("ray", reason="the Ray launcher is not installed here: make ray")
pytest.importorskip("hydra_plugins.hydra_ray_launcher", reason="the Ray launcher is not installed here: make ray")

pytestmark = pytest.mark.slow  # a Ray cluster, its workers, an MLflow server and two kvpipe drivers

SWEEP = [
    "-m", "hydra/launcher=ray_cluster", "model=tiny_random", "workload.max_new_tokens=3", "workload.warmup=0",
    "quality=off", "workload.prompts=[Hi.]", "workload.repeats=2", "backend=hqq", "cache=dynamic,quantized",
    "hydra.launcher.ray.remote.num_cpus=2",  # one job at a time on the two slots: the kill lands between their records
]  # fmt: skip


def test_a_sweep_on_a_ray_cluster_killed_and_resumed_lands_each_job_once_paired_on_its_node(tmp_path, monkeypatch):
    with ray_cluster() as address, mlflow_server(tmp_path / "server") as url:
        monkeypatch.setenv("RAY_ADDRESS", address)  # hydra/launcher=ray_cluster joins the cluster it names
        tracking = ["tracking=server", f"tracking.uri={url}"]
        killed_once_a_job_is_recorded([*SWEEP, *tracking], tmp_path, url)  # Ray stops the tasks the driver owned
        wait_for(lambda: not ray_tasks_running(), timeout_s=60)  # Ray stops the killed driver's task
        done_before = len(finished_children(url))  # one job's; the other was measuring, most likely
        assert 1 <= done_before <= 2

        resumed = run_cli([*SWEEP[1:], *tracking, "-m", "resume=true"], cwd=tmp_path, process=True, timeout=600)
        assert resumed.returncode == 0, (resumed.stdout + resumed.stderr)[-3000:]
        assert f"{2 - done_before} finished, {done_before} skipped" in resumed.stdout

        parents, children = runs_under_one_parent(url)
        assert len(parents) == 1 and parents[0].info.status == "FINISHED"  # the killed sweep's, reopened
        measured = finished_children(url)
        assert sorted(c.data.tags["kvpipe.cache.effective"] for c in measured) == [
            "dynamic", "quantized:hqq:int4:kivi",
        ]  # each job exactly once: nothing lost, nothing twice  # fmt: skip
        assert "RUNNING" not in {c.info.status for c in children}  # a half-logged child closed on resume
        assert_paired_on_node(url)  # compare reads them back, the quantized job paired on its node
    leftover = [p for p in psutil.process_iter(["cmdline"]) if FOLDER_PREFIX in " ".join(p.info["cmdline"] or [])]
    assert not leftover, [p.info["cmdline"][:3] for p in leftover]  # nothing of the cluster outlives it


def ray_tasks_running() -> bool:
    """Whether a Ray worker is running one of kvpipe's jobs (Ray names it after the task)."""
    return any("_run_job" in " ".join(p.info["cmdline"] or []) for p in psutil.process_iter(["cmdline"]))


@pytest.mark.parametrize(("device", "gpus"), [("cpu", 0), ("cuda", 1), ("cuda:1", 1), ("auto", 0)])
def test_a_ray_job_asks_a_gpu_where_its_model_runs_on_one(device, gpus):
    from kvpipe.orchestrate import cluster

    # auto: one where the cluster the sweep joined has a GPU; none joined here, so none
    assert cluster.gpus_per_job(device) == gpus
