"""A sweep's tracking worker (kvpipe.record.worker): calls made there look as if made here."""

from __future__ import annotations

import json
import logging
import os
import signal

import pytest
from paused_at import wait_until_paused
from test_resilience import IN_A_MEASURED_CALL, mlflow_runs, paused, start_cli

from kvpipe.errors import ConfigError, KvpipeError
from kvpipe.orchestrate import sweep
from kvpipe.record import worker
from kvpipe.record.store import TrackingUnavailable

from conftest import run_cli


@pytest.fixture
def started():
    worker.start()
    yield worker._worker.process
    worker.stop()


def test_a_call_in_the_worker_gives_back_its_value_output_and_log_records(started, capsys, caplog):
    assert worker.run("os", "getpid") == started.pid != os.getpid()
    worker.run("builtins", "print", "printed in the worker")
    with caplog.at_level(logging.INFO):
        worker.run("logging", "getLogger", "kvpipe.somewhere")  # warm: the next call only logs
        worker.run("logging", "root.warning", "logged in the worker: %s", "with its args")
    assert capsys.readouterr().out == "printed in the worker\n"
    assert "logged in the worker: with its args" in caplog.messages


def test_the_worker_raises_a_users_error_as_itself_and_a_bug_with_its_traceback(started):
    with pytest.raises(KvpipeError, match="credentials in the URI") as raised:
        worker.run("kvpipe.record.auth", "check_uri", "http://ann:secret@host:5000", "tracking.uri=…")
    assert type(raised.value) is KvpipeError
    # ConfigError's __init__ takes three arguments, so it cannot unpickle: its one line comes back
    with pytest.raises(KvpipeError, match=r"cache='lru' is not valid: expected one of: dynamic, static"):
        worker.run("kvpipe.errors", "require_choice", "cache", "lru", ["dynamic", "static"])
    with pytest.raises(worker.WorkerFailed, match=r"(?s)JSONDecodeError.*Traceback"):
        worker.run("json", "loads", "{")
    assert worker.run("builtins", "len", "still serving") == 13


def test_a_worker_that_dies_is_an_outage_and_later_calls_run_here(started):
    started.kill()
    started.wait()
    with pytest.raises(TrackingUnavailable, match="tracking worker stopped"):
        worker.run("os", "getpid")
    assert not worker.active()
    assert worker.run("os", "getpid") == os.getpid()


def test_a_warm_up_import_that_fails_is_skipped(started):
    worker.run("kvpipe.record.worker", "import_modules", ("no_such_module_here", "json"))
    assert worker.run("sys", "modules.__contains__", "json")


def test_a_call_runs_here_when_no_worker_is_started():
    assert not worker.active()
    assert worker.run("os", "getpid") == os.getpid()
    with pytest.raises(ConfigError):  # here, the exception itself
        worker.run("kvpipe.errors", "require_choice", "cache", "lru", ["dynamic"])


TRACKED_SWEEP = [
    "-m",
    "model=tiny_random",
    "workload.max_new_tokens=3",
    "workload.warmup=0",
    "quality=off",
    "workload.prompts=[Hi.]",
    "cache=dynamic,static",
]


@pytest.mark.slow  # a tracked sweep of two jobs, its MLflow side in the worker
def test_a_sweep_through_the_worker_records_what_one_without_it_does(tmp_path, existing_store, monkeypatch):
    existing_store(tmp_path)
    starts = []
    monkeypatch.setattr(sweep, "_worker_helps", lambda config: True)  # this process has MLflow imported already
    monkeypatch.setattr(worker, "start", lambda real=worker.start: (starts.append(1), real())[1])
    proc = run_cli(TRACKED_SWEEP, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert starts == [1] and not worker.active()
    assert "kvpipe compare · tiny_random" in proc.stdout and "2 finished, 0 skipped, 0 failed" in proc.stdout
    (sweep_dir,) = (tmp_path / "outputs" / "multiruns").glob("*/*")
    assert (sweep_dir / "compare.md").is_file() and (sweep_dir / "tpot_vs_memory.png").is_file()
    runs = mlflow_runs(tmp_path / "outputs" / "mlflow.db")
    (parent,) = [r for r in runs if r.data.tags.get("kvpipe.sweep") == "true"]
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    assert parent.info.status == "FINISHED" and parent.data.metrics["jobs_finished"] == 2
    assert sorted(r.data.params["cache.strategy"] for r in children) == ["dynamic", "static"]
    assert {r.info.status for r in children} == {"FINISHED"}
    results = [json.loads(p.read_text()) for p in sweep_dir.glob("*/result.json")]
    assert sorted(r["mlflow_run_id"] for r in results) == sorted(r.info.run_id for r in children)
    artifacts = {a.path for a in mlflow_client(tmp_path).list_artifacts(parent.info.run_id, "compare")}
    assert "compare/compare.md" in artifacts


@pytest.mark.slow  # a tracked sweep's start, interrupted
def test_ctrl_c_while_the_worker_opens_the_parent_leaves_it_killed(tmp_path, existing_store, monkeypatch):
    from kvpipe.model import loading

    existing_store(tmp_path)
    monkeypatch.setattr(sweep, "_worker_helps", lambda config: True)

    def interrupted():
        raise KeyboardInterrupt  # as Ctrl-C during the imports: the worker is still opening the parent

    monkeypatch.setattr(loading, "import_libraries", interrupted)
    proc = run_cli(TRACKED_SWEEP, cwd=tmp_path)
    assert proc.returncode == 130, proc.stderr[-3000:]
    assert not worker.active()
    (parent,) = mlflow_runs(tmp_path / "outputs" / "mlflow.db")
    assert parent.data.tags["kvpipe.sweep"] == "true" and parent.info.status == "KILLED"


def mlflow_client(launch_dir):
    from mlflow.tracking import MlflowClient

    return MlflowClient(f"sqlite:///{launch_dir / 'outputs' / 'mlflow.db'}")


@pytest.mark.slow  # a kvpipe sweep in a process of its own, interrupted from its terminal
def test_ctrl_c_at_a_terminal_closes_the_sweep_through_its_worker(tmp_path, existing_store):
    existing_store(tmp_path)
    # A session of its own, so that the signal reaches the sweep and its worker as Ctrl-C at a terminal would;
    # stopped in the first job's first measured call, before the second job is prepared
    proc = start_cli(TRACKED_SWEEP, tmp_path, pause_at=IN_A_MEASURED_CALL, start_new_session=True)
    try:
        wait_until_paused(proc, paused(tmp_path))
        os.killpg(proc.pid, signal.SIGINT)
        output, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, output[-2000:]
    runs = mlflow_runs(tmp_path / "outputs" / "mlflow.db")
    (parent,) = [r for r in runs if r.data.tags.get("kvpipe.sweep") == "true"]
    (child,) = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    assert parent.info.status == "KILLED" and child.info.status == "KILLED"
