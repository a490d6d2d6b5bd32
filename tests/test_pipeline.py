"""The default pipeline end to end: generation, result.json, and the MLflow run read back."""

from __future__ import annotations

import json
import re
from dataclasses import replace

import pytest

from kvpipe.orchestrate.pipeline import run_pipeline

from conftest import run_cli, spec_for

CONTRACT_METRICS = ("ttft_ms", "tpot_ms", "decode_tokens_per_s", "e2e_ms", "peak_memory_bytes", "kv_cache_bytes")


def tracked_tiny_spec(tmp_path, *extra):
    spec = spec_for("model=tiny_random", "workload.max_new_tokens=5", "workload.warmup=0", *extra)
    return replace(spec, tracking=replace(spec.tracking, uri=f"sqlite:///{tmp_path}/mlflow.db"))


def test_tiny_random_pipeline_writes_result_json_with_contract_metrics(tmp_path, tiny_spec):
    result = run_pipeline(tiny_spec(), tmp_path / "run", tmp_path, print_table=False)
    on_disk = json.loads((tmp_path / "run" / "result.json").read_text())
    assert on_disk["status"] == "FINISHED"
    for name in CONTRACT_METRICS:
        assert on_disk["metrics"][name] > 0, name
    assert on_disk["metrics"]["new_tokens"] == 6
    assert len(on_disk["texts"]) == len(tiny_spec().workload.prompts)
    assert result.tags["cache.effective"] == "dynamic"


@pytest.mark.slow  # a real job logged to a new MLflow store
def test_mlflow_run_reads_back_with_params_metrics_tags_and_artifacts(tmp_path, existing_store):
    import mlflow
    from mlflow.tracking import MlflowClient

    existing_store(tmp_path, "mlflow.db")  # a first run making a store: below, and test_resilience
    spec = tracked_tiny_spec(tmp_path)
    result = run_pipeline(spec, tmp_path / "run", tmp_path, print_table=False)
    mlflow.set_tracking_uri(spec.tracking.uri)
    client = MlflowClient()
    run = client.get_run(result.mlflow_run_id)
    assert run.info.status == "FINISHED"
    assert run.data.params["cache.strategy"] == "dynamic"
    assert run.data.params["model.name"] == "tiny_random"
    for name in CONTRACT_METRICS:
        assert run.data.metrics[name] == pytest.approx(result.metrics[name])
    tags = run.data.tags
    assert tags["kvpipe.cache.requested"] == "dynamic" and tags["kvpipe.cache.effective"] == "dynamic"
    assert tags["kvpipe.device"] == "cpu"
    assert tags["kvpipe.torch_version"] and tags["kvpipe.transformers_version"]
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"config.yaml", "texts.json", "result.json"} <= artifacts


@pytest.mark.slow  # an MLflow store (a migrated one, copied)
@pytest.mark.parametrize("made_before", [False, True], ids=["made by kvpipe", "made before without a kind"])
def test_an_experiment_kvpipe_writes_to_opens_on_its_runs_in_mlflows_ui(made_before, tmp_path, existing_store):
    from mlflow.tracking import MlflowClient

    from kvpipe.config import TrackingConfig
    from kvpipe.record.store import open_experiment

    tracking = TrackingConfig(uri=f"sqlite:///{existing_store(tmp_path, 'mlflow.db')}")
    if made_before:
        MlflowClient(tracking.uri).create_experiment(tracking.experiment)
    experiment_id = open_experiment(tracking, tmp_path)
    # MLflow 3 opens an experiment without a kind in its GenAI view, which lists traces, not runs
    assert MlflowClient(tracking.uri).get_experiment(experiment_id).tags["mlflow.experimentKind"] == (
        "custom_model_development"
    )


@pytest.mark.slow  # an MLflow store (a migrated one, copied)
def test_an_experiment_kind_the_user_chose_is_kept(tmp_path, existing_store):
    from mlflow.tracking import MlflowClient

    from kvpipe.config import TrackingConfig
    from kvpipe.record.store import open_experiment

    tracking = TrackingConfig(uri=f"sqlite:///{existing_store(tmp_path, 'mlflow.db')}")
    client = MlflowClient(tracking.uri)
    client.create_experiment(tracking.experiment, tags={"mlflow.experimentKind": "genai_development"})
    experiment_id = open_experiment(tracking, tmp_path)
    assert client.get_experiment(experiment_id).tags["mlflow.experimentKind"] == "genai_development"


@pytest.mark.slow  # a real job making a new MLflow store
def test_a_first_run_makes_its_store_without_mlflows_migration_lines(tmp_path):
    args = ["model=tiny_random", "workload.max_new_tokens=3", "workload.warmup=0", "quality=off"]
    proc = run_cli([*args, "workload.prompts=[Hi.]"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (tmp_path / "outputs" / "mlflow.db").is_file()
    assert "MLflow run" in proc.stdout  # kvpipe's own INFO lines still show (Hydra logs to stdout)
    for line in (proc.stderr + proc.stdout).splitlines():
        assert not re.search(r"database tables|alembic|SQLiteImpl|non-transactional DDL", line, re.I), line


def test_default_store_is_absolute_sqlite_under_outputs(tmp_path):
    from kvpipe.config import TrackingConfig
    from kvpipe.record.store import store_paths

    uri, artifacts = store_paths(TrackingConfig(), tmp_path)
    assert uri == f"sqlite:///{tmp_path}/outputs/mlflow.db"
    assert artifacts == (tmp_path / "outputs" / "mlartifacts").as_uri()


@pytest.mark.slow  # a real job
def test_tracking_off_still_writes_result_json(tmp_path, tiny_spec):
    # in-process: `python -m kvpipe` itself runs in test_cli_default_run_on_the_embedded_model (slow)
    assert tiny_spec().tracking.enabled is False  # tracking=off, as conftest.TINY composes it
    run_pipeline(tiny_spec(), tmp_path / "outputs" / "runs" / "day" / "time", tmp_path, print_table=False)
    assert list((tmp_path / "outputs" / "runs").glob("*/*/result.json"))
    assert not (tmp_path / "outputs" / "mlflow.db").exists()


@pytest.mark.slow  # saves and loads a model folder, then runs it
def test_hf_model_from_a_local_folder(tmp_path, tiny_spec):
    from kvpipe import model as models

    loaded = models.load(tiny_spec().model)
    folder = tmp_path / "my-model"
    loaded.model.save_pretrained(folder)
    loaded.tokenizer.save_pretrained(folder)
    spec = spec_for(
        "model=hf", f"model.name_or_path={folder}", "workload.max_new_tokens=3", "workload.warmup=0", "tracking=off"
    )
    result = run_pipeline(spec, tmp_path / "run", tmp_path, print_table=False)
    assert result.metrics["new_tokens"] == 3


def test_long_context_prompts_have_exactly_the_requested_tokens(tmp_path, tiny_spec):
    spec = tiny_spec(
        "workload=long_context",
        "workload.prompt_tokens=333",
        "workload.max_new_tokens=2",
        "workload.batch_size=2",
        "workload.warmup=0",
    )
    result = run_pipeline(spec, tmp_path / "run", tmp_path, print_table=False)
    assert result.metrics["prompt_tokens"] == 333
    assert result.metrics["batch_size"] == 2
    assert result.metrics["kv_cache_tokens"] == 333 + 2 - 1


@pytest.mark.slow  # a kvpipe process loading the embedded model
def test_cli_default_run_on_the_embedded_model_prints_table_and_records_run(tmp_path, existing_store):
    # The default config end to end, as a user runs it: embedded model, dynamic cache, quality on (a
    # smaller window than the default 512 tokens: quality is not what this checks), MLflow in outputs/
    # (a store that exists: a first run making one is test_resilience's two concurrent jobs).
    import mlflow

    existing_store(tmp_path)
    proc = run_cli(
        [
            "workload.max_new_tokens=4",
            "workload.warmup=0",
            "workload.prompts=[Say hello.]",
            "quality.windows=1",
            "quality.scored_tokens=8",
        ],
        cwd=tmp_path,
        process=True,  # the one default job in a process of its own, as `python -m kvpipe`
    )
    assert proc.returncode == 0, proc.stderr
    assert "TPOT" in proc.stdout and "KV cache" in proc.stdout
    (result,) = (tmp_path / "outputs" / "runs").glob("*/*/result.json")
    assert (tmp_path / "outputs" / "mlflow.db").is_file()
    document = json.loads(result.read_text())
    assert document["config"]["model"]["name"] == "smollm2_135m"
    assert document["metrics"]["decode_tokens_per_s"] > 0
    assert document["texts"][0]["completion"].strip()
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path}/outputs/mlflow.db")
    (run,) = mlflow.search_runs(experiment_names=["kvpipe"], output_format="list")
    assert run.info.run_id == document["mlflow_run_id"] and run.data.params["model.name"] == "smollm2_135m"


@pytest.mark.slow  # a real job logged to an MLflow store
def test_mlflow_run_lasts_as_long_as_its_job_not_its_logging(tmp_path, existing_store):
    import time

    from mlflow.tracking import MlflowClient

    existing_store(tmp_path, "mlflow.db")
    spec = tracked_tiny_spec(tmp_path, "workload.repeats=3")
    before_ms = time.time() * 1e3
    result = run_pipeline(spec, tmp_path / "run", tmp_path, print_table=False)
    run = MlflowClient(spec.tracking.uri).get_run(result.mlflow_run_id)
    started_ms, ended_ms = result.span_ms()
    assert (run.info.start_time, run.info.end_time) == (started_ms, ended_ms)
    assert before_ms - 1 <= started_ms  # the job's own start, not the moment it was logged
    assert run.info.end_time - run.info.start_time >= result.metrics["measured_ms"] + result.metrics["warmup_ms"]
