"""Multirun: one process reuses the model, MLflow parent/child runs, skips, failures, resume."""

from __future__ import annotations

import json

import pytest

from conftest import run_cli

TINY = ["model=tiny_random", "workload.max_new_tokens=3", "workload.warmup=0", "quality=off", "workload.prompts=[Hi.]"]


def sweep_results(tmp_path) -> list[dict]:
    (sweep_dir,) = (tmp_path / "outputs" / "multiruns").glob("*/*")
    return [json.loads(p.read_text()) for p in sorted(sweep_dir.glob("*/result.json"))]


def child_runs(tmp_path):
    import mlflow

    mlflow.set_tracking_uri(f"sqlite:///{tmp_path}/outputs/mlflow.db")
    parents = mlflow.search_runs(
        experiment_names=["kvpipe"], filter_string="tags.`kvpipe.sweep` = 'true'", output_format="list"
    )
    assert len(parents) == 1
    children = mlflow.search_runs(
        experiment_names=["kvpipe"],
        output_format="list",
        filter_string=f"tags.`mlflow.parentRunId` = '{parents[0].info.run_id}'",
    )
    return parents[0], children


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    """cache x backend: dense caches ignore backend, so two of the six jobs are duplicates."""
    tmp_path = tmp_path_factory.mktemp("sweep")
    proc = run_cli(["-m", *TINY, "cache=dynamic,static,quantized", "backend=quanto,hqq"], cwd=tmp_path)
    return tmp_path, proc


def test_sweep_runs_every_combination_and_skips_duplicates(sweep):
    tmp_path, proc = sweep
    assert proc.returncode == 0, proc.stderr[-3000:]
    statuses = [r["status"] for r in sweep_results(tmp_path)]
    assert statuses.count("FINISHED") == 4  # dynamic, static, quantized x 2 backends
    assert statuses.count("SKIPPED") == 2
    assert "4 finished, 2 skipped, 0 failed" in proc.stdout


def test_sweep_jobs_are_children_of_one_parent_run(sweep):
    tmp_path, _ = sweep
    parent, children = child_runs(tmp_path)
    assert parent.info.status == "FINISHED"
    assert len(children) == 4 and all(c.info.status == "FINISHED" for c in children)
    assert parent.data.metrics["jobs_finished"] == 4


def test_sweep_loads_the_model_once(sweep):
    _, proc = sweep
    assert (proc.stdout + proc.stderr).count("loaded tiny_random") == 1


def test_invalid_combination_is_skipped_with_its_reason(tmp_path):
    proc = run_cli(["-m", *TINY, "cache=quantized", "backend=quanto", "backend.nbits=4,3"], cwd=tmp_path)
    statuses = [r["status"] for r in sweep_results(tmp_path)]
    assert statuses == ["FINISHED", "SKIPPED"]
    assert "backend.nbits" in sweep_results(tmp_path)[1]["reason"]
    assert proc.returncode == 0


def test_failed_job_becomes_a_failed_run_and_the_sweep_goes_on_with_nonzero_exit(tmp_path):
    from mlflow.tracking import MlflowClient

    from conftest import REPO

    # config.json but no weights: the spec is valid, the load fails
    proc = run_cli(
        ["-m", *TINY, "model=hf,tiny_random", f"model.name_or_path={REPO}/tests/data/tiny_llama"], cwd=tmp_path
    )
    assert proc.returncode == 1
    assert [r["status"] for r in sweep_results(tmp_path)] == ["FAILED", "FINISHED"]
    assert "1 finished, 0 skipped, 1 failed" in proc.stdout
    parent, children = child_runs(tmp_path)
    assert parent.info.status == "FAILED"
    (failed,) = [c for c in children if c.info.status == "FAILED"]
    assert "tiny_llama" in failed.data.tags["kvpipe.error"]
    artifacts = {a.path for a in MlflowClient().list_artifacts(failed.info.run_id)}
    assert "traceback.txt" in artifacts


def test_resume_skips_jobs_already_finished(tmp_path):
    first = run_cli(["-m", *TINY, "cache=dynamic,static"], cwd=tmp_path)
    assert first.returncode == 0, first.stderr[-2000:]
    second = run_cli(["-m", *TINY, "cache=dynamic,static,quantized", "resume=true"], cwd=tmp_path)
    assert second.returncode == 0, second.stderr[-2000:]
    assert "1 finished, 2 skipped" in second.stdout
    import mlflow

    mlflow.set_tracking_uri(f"sqlite:///{tmp_path}/outputs/mlflow.db")
    jobs = mlflow.search_runs(
        experiment_names=["kvpipe"], output_format="list", filter_string="tags.`kvpipe.status` = 'FINISHED'"
    )
    assert len(jobs) == 3  # no duplicates: dynamic and static once each, quantized once
