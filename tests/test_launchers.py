"""Beyond one process: Hydra's submitit launcher (a sweep killed and resumed), and a real MLflow server
without authentication.

submitit (`local`) runs against the launch dir's SQLite store, its two jobs side by side, so the store
takes concurrent writers (see also test_resilience's two concurrent jobs). joblib (`parallel`) runs
against `make mlflow-server MLFLOW_AUTH=1` in test_auth, the server kvpipe asks teams to share; here a
job goes through the door of a plain `make mlflow-server`, which has no login to check."""

from __future__ import annotations

import contextlib
import math
import signal

import pytest
from test_resilience import start_cli, wait_for

from conftest import mlflow_server, run_cli

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


def test_a_submitit_sweep_killed_and_resumed_lands_each_job_once_under_one_parent(tmp_path, existing_store):
    existing_store(tmp_path)
    uri = f"sqlite:///{tmp_path}/outputs/mlflow.db"
    # submitit, this machine: its two jobs run in processes of their own, started from this one, which is
    # killed once the first job is recorded
    killed_once_a_job_is_recorded(["-m", "hydra/launcher=local", *TINY], tmp_path, uri)
    # submitit's job processes outlive their driver: each ends as it would have (recorded, or not yet)
    wait_for(lambda: not processes_naming(tmp_path), timeout_s=120)
    done_before = len(finished_children(uri))
    assert 1 <= done_before <= 2

    resumed = run_cli(["-m", "hydra/launcher=local", *TINY, "resume=true"], cwd=tmp_path)
    assert resumed.returncode == 0, (resumed.stdout + resumed.stderr)[-3000:]
    assert f"{2 - done_before} finished, {done_before} skipped" in resumed.stdout
    parents, children = runs_under_one_parent(uri)
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"  # the killed sweep's, reopened
    assert sorted(c.data.tags["kvpipe.cache.effective"] for c in finished_children(uri)) == [
        "dynamic", "quantized:hqq:int4:kivi",
    ]  # each job exactly once  # fmt: skip
    assert "RUNNING" not in {c.info.status for c in children}
    assert_paired_on_node(uri)


def killed_once_a_job_is_recorded(args: list[str], cwd, uri: str) -> None:
    """A sweep `kvpipe ARGS` in a process of its own, SIGKILLed once its store holds a FINISHED job; it
    said at its start that each job is paired on its node."""
    proc = start_cli(args, cwd)
    try:
        wait_for(lambda: len(finished_children(uri)) >= 1 or proc.poll() is not None, timeout_s=240)
        proc.send_signal(signal.SIGKILL)
        output, _ = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert "each job takes turns by call with a copy of the baseline (cache=dynamic)" in output, output[-3000:]


def finished_children(uri: str) -> list:
    _, children = runs_under_one_parent(uri)
    return [c for c in children if c.info.status == "FINISHED" and c.data.tags.get("kvpipe.status") == "FINISHED"]


def processes_naming(folder) -> list:
    """The processes whose command line names `folder` (a launcher's job processes, by their job folder)."""
    import psutil

    found = []
    for proc in psutil.process_iter(["cmdline"]):
        with contextlib.suppress(psutil.Error):
            if str(folder) in " ".join(proc.info["cmdline"] or []):
                found.append(proc)
    return found


def assert_paired_on_node(uri: str) -> None:
    """The dynamic job measured alone; the quantized one beside its own copy of the dynamic cache, in
    its process, and compare reads its ratio from that pair (paired call by call)."""
    from kvpipe.decide import paired
    from kvpipe.decide.runs import load_runs

    runs = paired.with_ratios(load_runs("kvpipe", None, uri)[0])
    by_label = {run["label"]: run for _, run in runs.iterrows()}
    run = by_label["quantized:hqq:int4:kivi"]
    assert run["tags.kvpipe.measured_order"] == "paired_on_node"
    assert run["tags.kvpipe.pair.label"] == "dynamic"
    assert run["tags.kvpipe.pair.call_keys"] == run["tags.kvpipe.call_keys"]
    # How many pairs count depends on what else held the cores: the job's process cannot be told to count
    # them all (test_sweep does, in its own process), and on a busy machine every pair of a short job can
    # have a call left out. Then it has no ratio, and each of its pairs must show why.
    if run["ratio_tpot_ms"] is None:
        mine, theirs = (paired.call_series(row, "tpot_ms") for row in (run, paired.copy_beside(run, "dynamic")))
        assert mine and len(mine) == len(theirs), (mine, theirs)
        assert all(math.isnan(a) or math.isnan(b) for a, b in zip(mine, theirs)), (mine, theirs)
    else:
        assert run["ratio_tpot_ms"].paired
    dynamic = by_label["dynamic"]
    assert dynamic["tags.kvpipe.measured_order"] == "sequential" and dynamic["ratio_tpot_ms"] is None


@pytest.fixture
def plain_server(tmp_path):
    """`make mlflow-server` on loopback, with its store in tmp_path; stopped after the test."""
    with mlflow_server(tmp_path / "server") as url:
        yield url


def test_a_job_against_a_plain_tracking_server_passes_the_door_and_lands(plain_server, tmp_path):
    import mlflow

    from kvpipe.orchestrate.pipeline import run_pipeline

    from conftest import TINY as TINY_JOB
    from conftest import spec_for

    # In this process: the server is what this checks. Its basic-auth endpoints answer 404, so the
    # door check is the experiment's look-up alone.
    spec = spec_for(*TINY_JOB, "tracking=server", f"tracking.uri={plain_server}")
    result = run_pipeline(spec, tmp_path / "outputs" / "runs" / "day" / "job", tmp_path, print_table=False)
    mlflow.set_tracking_uri(plain_server)
    run = mlflow.get_run(result.mlflow_run_id)
    assert run.info.status == "FINISHED" and run.data.tags["kvpipe.status"] == "FINISHED"
    assert not (tmp_path / "outputs" / "mlflow.db").exists()  # nothing went to the local store
