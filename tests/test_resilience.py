"""Nothing lost: OOM fallback, unreachable tracking, sync once, Ctrl-C, SIGKILL + resume, parallel writers."""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import torch
from paused_at import kvpipe_paused_at, wait_until_paused

from kvpipe import cli
from kvpipe.job import runner
from kvpipe.orchestrate.pipeline import run_pipeline
from kvpipe.record import worker

from conftest import run_cli, spec_for

TINY = ["model=tiny_random", "workload.max_new_tokens=3", "workload.warmup=0", "quality=off", "workload.prompts=[Hi.]"]


def inject_oom(monkeypatch, strategies: set[str], error=torch.OutOfMemoryError):
    """Make generation run out of memory while the cache is one of `strategies`."""
    real = runner.measured_generate

    def flaky(spec, loaded, setup, batch):
        if spec.cache.strategy in strategies:
            raise error("CUDA out of memory. Tried to allocate 2.00 GiB (injected)")
        return real(spec, loaded, setup, batch)

    monkeypatch.setattr(runner, "measured_generate", flaky)


def test_out_of_memory_falls_back_to_the_next_strategy_and_records_it(monkeypatch):
    inject_oom(monkeypatch, {"dynamic"})
    result = runner.run_job(spec_for(*TINY, "tracking=off"))
    assert result.tags["fallback_from"] == "dynamic"
    assert result.tags["fallback_to"] == "offloaded"
    assert "out of memory" in result.tags["fallback_error"]
    assert result.tags["cache.requested"] == "dynamic"
    assert result.metrics["new_tokens"] == 3


def test_fallback_chain_goes_on_until_one_fits(monkeypatch):
    inject_oom(monkeypatch, {"dynamic", "offloaded"}, error=MemoryError)
    result = runner.run_job(spec_for(*TINY, "tracking=off", "fallback=[offloaded,quantized]"))
    assert (result.tags["fallback_from"], result.tags["fallback_to"]) == ("dynamic", "quantized")
    assert result.tags["fallback_error"].startswith("MemoryError")


def test_out_of_memory_with_nothing_left_to_try_is_raised(monkeypatch):
    inject_oom(monkeypatch, {"dynamic", "offloaded"})
    with pytest.raises(torch.OutOfMemoryError):
        runner.run_job(spec_for(*TINY, "tracking=off"))


def test_unknown_fallback_strategy_is_a_config_error():
    from kvpipe.errors import ConfigError

    with pytest.raises(ConfigError, match=r"fallback\[0\]"):
        spec_for("fallback=[pagd]")
    with pytest.raises(ConfigError, match=r"fallback\[0\]='paged' is not valid: expected one of: dynamic"):
        spec_for("fallback=[paged]")  # a fallback retries one batch: continuous batching cannot


def mlflow_runs(db: Path):
    import mlflow

    mlflow.set_tracking_uri(f"sqlite:///{db}")
    return mlflow.search_runs(experiment_names=["kvpipe"], output_format="list")


@pytest.mark.slow  # waits out a tracking server that never answers (~5 s)
def test_unreachable_server_keeps_the_result_and_sync_uploads_it_once(
    tmp_path, monkeypatch, caplog, capsys, existing_store
):
    # In-process: the job, then `kvpipe sync` twice through the CLI's dispatch (as test_recommend does)
    spec = spec_for(*TINY, "tracking.uri=http://127.0.0.1:9")
    with caplog.at_level("WARNING", logger="kvpipe"):
        run_pipeline(spec, tmp_path / "outputs" / "runs" / "day" / "job", tmp_path, print_table=False)
    assert "unreachable" in caplog.text and "kvpipe sync" in caplog.text
    (result,) = (tmp_path / "outputs" / "runs").glob("*/*/result.json")
    document = json.loads(result.read_text())
    assert document["status"] == "FINISHED" and "mlflow_run_id" not in document
    db = existing_store(tmp_path, "synced.db")
    monkeypatch.chdir(tmp_path)
    assert cli.subcommand(["sync", "outputs", f"--tracking-uri=sqlite:///{db}"]) == 0
    capsys.readouterr()
    assert cli.subcommand(["sync", "outputs", f"--tracking-uri=sqlite:///{db}"]) == 0
    assert "nothing to sync" in capsys.readouterr().out
    (run,) = mlflow_runs(db)
    assert run.info.status == "FINISHED"
    assert json.loads(result.read_text())["mlflow_run_id"] == run.info.run_id


# Where a test stops a kvpipe process (kill_points): its first measured call, or a sweep's second record
IN_A_MEASURED_CALL = ("kvpipe.job.runner:measured_generate", 1)
BEFORE_THE_SECOND_RECORD = ("kvpipe.orchestrate.sweep:record_measured", 2)


def paused(cwd: Path) -> Path:
    """The file a kvpipe process started with `pause_at` writes once it waits at its kill point."""
    return cwd / "paused_at_kill_point"


def start_cli(args: list[str], cwd: Path, pause_at: tuple[str, int] | None = None, **popen) -> subprocess.Popen:
    """`kvpipe ARGS` in a process of its own; with pause_at, waiting at that kill point once paused(cwd)
    exists. A shell that started us in the background may have set SIGINT to "ignore", which children
    inherit: the default is restored, so that the child's Python turns SIGINT into KeyboardInterrupt, as
    at a terminal."""
    command = [sys.executable, "-m", "kvpipe", *args]
    if pause_at is not None:
        command = kvpipe_paused_at(*pause_at, paused(cwd), args)
    # stdout and stderr together by default; **popen may say otherwise
    streams = {"stdout": subprocess.PIPE, "stderr": subprocess.STDOUT, **popen}
    return subprocess.Popen(
        command, cwd=cwd, text=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL), **streams
    )


def wait_for(predicate, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.2)


@pytest.mark.slow  # a kvpipe process, interrupted
def test_ctrl_c_marks_the_run_killed(tmp_path, existing_store):
    existing_store(tmp_path)
    proc = start_cli(TINY, tmp_path, pause_at=IN_A_MEASURED_CALL)
    wait_until_paused(proc, paused(tmp_path))
    proc.send_signal(signal.SIGINT)
    try:
        output, _ = proc.communicate(timeout=120)
    finally:
        proc.kill()  # never leave a runaway generation behind for the rest of the suite
    assert proc.returncode == 130, output[-2000:]
    (result,) = tmp_path.glob("outputs/runs/*/*/result.json")
    assert json.loads(result.read_text())["status"] == "KILLED"
    (run,) = mlflow_runs(tmp_path / "outputs" / "mlflow.db")
    assert run.info.status == "KILLED"


def tracking_workers(pid: int) -> list[psutil.Process]:
    """The tracking worker (kvpipe.record.worker) that the sweep in process `pid` started."""
    found = []
    for child in psutil.Process(pid).children():
        with contextlib.suppress(psutil.NoSuchProcess):  # a short-lived child, gone meanwhile
            if worker.__name__ in child.cmdline():
                found.append(child)
    return found


def gone(process: psutil.Process) -> bool:
    """Exited (a zombie too: once its parent is killed, whoever adopts it may be slow to reap it)."""
    try:
        return process.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def finished_runs(tmp_path: Path) -> list:
    return [
        r
        for r in mlflow_runs(tmp_path / "outputs" / "mlflow.db")
        if r.info.status == "FINISHED" and r.data.tags.get("kvpipe.status") == "FINISHED"
    ]


@pytest.mark.slow  # a kvpipe sweep, killed, then resumed in a second process
def test_sigkilled_sweep_resumes_only_the_missing_jobs(tmp_path, existing_store):
    existing_store(tmp_path)
    # hqq: quanto would JIT-load its C++ extension under a lock file that a SIGKILL can leave behind
    sweep = ["-m", *TINY, "cache=dynamic,static,offloaded_static,quantized", "backend=hqq"]
    # killed once the first job is recorded and before the second is: the jobs, measured in shared rounds,
    # are recorded back to back, and a kill that lands after a poll saw the first could find all four done
    proc = start_cli(sweep, tmp_path, pause_at=BEFORE_THE_SECOND_RECORD)
    wait_until_paused(proc, paused(tmp_path))
    assert len(list(tmp_path.glob("outputs/multiruns/*/*/*/result.json"))) == 1
    # The sweep's tracking worker outlives the kill until the call it is in ends: a job it was logging turns
    # FINISHED after the kill, and resume skips it. Counted only once the worker is gone, as resume sees it.
    (tracking_worker,) = tracking_workers(proc.pid)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    wait_for(lambda: gone(tracking_worker), timeout_s=60)
    done_before = len(finished_runs(tmp_path))  # recorded by the killed sweep, its worker included
    assert done_before <= 1
    resumed = run_cli([*sweep[1:], "-m", "resume=true"], cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert len(finished_runs(tmp_path)) == 4  # each job exactly once
    assert f"{4 - done_before} finished, {done_before} skipped" in resumed.stdout
    runs = mlflow_runs(tmp_path / "outputs" / "mlflow.db")
    assert "RUNNING" not in {r.info.status for r in runs}  # a half-logged child closed on resume
    (parent,) = [r for r in runs if r.data.tags.get("kvpipe.sweep") == "true"]  # reused: no second, empty one
    assert parent.info.status == "FINISHED"
    # a child the kill caught half-logged is KILLED now, though it was tagged FINISHED: its job ran again
    measured = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id
                and r.data.tags.get("kvpipe.status") == "FINISHED" and r.info.status == "FINISHED"]  # fmt: skip
    assert len(measured) == 4  # both attempts' jobs under the one parent


@pytest.mark.slow  # two kvpipe processes at once, making one new store between them
def test_two_concurrent_jobs_on_one_sqlite_store_lose_no_run(tmp_path):
    # No store yet: the first run makes outputs/mlflow.db (as test_pipeline's first run does)
    procs = [start_cli([*TINY, f"workload.seed={seed}"], tmp_path) for seed in (1, 2)]
    for proc in procs:
        output, _ = proc.communicate(timeout=300)
        assert proc.returncode == 0, output[-2000:]
    assert len(mlflow_runs(tmp_path / "outputs" / "mlflow.db")) == 2
