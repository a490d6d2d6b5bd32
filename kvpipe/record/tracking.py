"""MLflow's runs: one per job, a sweep's parent and its skipped jobs, and resume's look-up of a finished one.

Each call to the store runs inside auth.recording (one writer at a time, a refusal or an outage as one
line); where the store is, kvpipe.record.store says.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shlex
import time
from dataclasses import dataclass
from pathlib import Path

from kvpipe import kill_points
from kvpipe.config import TrackingConfig
from kvpipe.record import tags as mlflow_tags
from kvpipe.record import worker
from kvpipe.record.auth import check_at_door, recording, refusals
from kvpipe.record.exactly_once import run_holding
from kvpipe.record.requests import log_requests
from kvpipe.record.result import RESULT_FILE, Result
from kvpipe.record.scored import log_scored
from kvpipe.record.table import RunRecord
from kvpipe.record.traces import log_answers
from kvpipe.record.worker import forwarded

log = logging.getLogger(__name__)


@forwarded  # in a sweep's tracking worker, if it has one (kvpipe.record.worker)
def log_job(
    tracking: TrackingConfig,
    launch_dir: Path,
    run_dir: Path,
    params: dict[str, str],
    result: Result,
    config_yaml: str,
    parent_run_id: str | None = None,
) -> Logged:
    """One MLflow run: params, metrics, tags, and the config, texts and result.json as artifacts;
    none where a run holds the job already (kvpipe.record.exactly_once).

    A FAILED result becomes a FAILED run with its error and traceback; the context manager
    also marks the run FAILED if logging itself breaks, so no run is left RUNNING."""
    from mlflow.tracking import MlflowClient

    with recording(tracking, launch_dir) as experiment_id:
        held = run_holding(MlflowClient(), experiment_id, result, parent_run_id)
        if held:
            return Logged(held, new=False)
        return Logged(_log_job(tracking, experiment_id, run_dir, params, result, config_yaml, parent_run_id), new=True)


@dataclass
class Logged:
    """A job's run: its id, and whether this call logged it (False: the store held it already)."""

    run_id: str
    new: bool


def _log_job(tracking, experiment_id, run_dir, params, result: Result, config_yaml, parent_run_id) -> str:
    import mlflow
    from mlflow.tracking import MlflowClient

    client = MlflowClient()

    tags = {mlflow_tags.of(k): v for k, v in result.tags.items()}
    if parent_run_id:
        tags[mlflow_tags.PARENT] = parent_run_id
    if result.measurement_key:
        tags[mlflow_tags.KEY] = result.measurement_key
    tags[mlflow_tags.JOB_ID] = result.job_id
    if result.reason:
        tags[mlflow_tags.ERROR] = result.reason[:5000]
    tags.update(origin_tags(result))
    metrics = {k: float(v) for k, v in result.metrics.items() if v is not None}
    name = tracking.run_name or run_name(result)
    span = result.span_ms()
    if span:  # created at the job's start, so MLflow's Duration is the job's, not its logging's
        from mlflow.tracking.context import registry

        run_id = client.create_run(
            experiment_id, start_time=span[0], tags=registry.resolve_tags(tags), run_name=name
        ).info.run_id
        opened = mlflow.start_run(run_id=run_id)
    else:
        opened = mlflow.start_run(experiment_id=experiment_id, run_name=name, tags=tags)
    with opened as run:
        kill_points.reached("after_run_created", writer=worker.caller())
        mlflow.log_params(params)
        mlflow.log_metrics(metrics)
        mlflow.log_text(config_yaml, "config.yaml")
        if result.texts:
            mlflow.log_dict({"texts": result.texts}, "texts.json")
            log_prompts(result)
        if result.traceback:
            mlflow.log_text(result.traceback, "traceback.txt")
        if result.answers:
            scored = result.scored()
            log_scored(run.info.run_id, run_dir, scored)
            log_answers(experiment_id, run.info.run_id, scored.answers, scored.scorer, cache_label(result))
        if result.requests:
            log_requests(run_dir, result.requests)
        mlflow.log_artifact(str(run_dir / RESULT_FILE))
        # Last: a run killed while logging never claims to hold a complete result
        mlflow.set_tag(mlflow_tags.STATUS, result.status)
        run_id = run.info.run_id
    if span or result.status != "FINISHED":  # kvpipe's FAILED and KILLED are MLflow's own terminal statuses
        client.set_terminated(run_id, status=result.status, end_time=span[1] if span else None)
    kill_points.reached("after_run_logged", writer=worker.caller())
    return run_id


def run_name(result: Result) -> str:
    """`requested→effective · model · workload`, e.g. `offloaded_static→static · smollm2_135m · chat 32`:
    the strategy as asked for and as it ran (when they differ), the model, the workload's size (its
    class says how: `long_context 1000+64`, `passkey 500,1000`, `dataset prompts.jsonl`)."""
    config = result.config
    workload = config["workload"]
    size = result.workload().size_label()
    batch = f" ×{workload['batch_size']}" if workload["batch_size"] > 1 else ""
    return f"{cache_label(result)} · {config['model']['name']} · {workload['kind']} {size}{batch}"


def cache_label(result: Result) -> str:
    """The cache as asked for and as it ran, where they differ: `offloaded_static→static`."""
    requested = result.tags.get("cache.requested") or result.config["cache"]["strategy"]
    effective = result.tags.get("cache.effective") or requested
    return effective if effective.startswith(requested) else f"{requested}→{effective}"


def origin_tags(result: Result) -> dict[str, str]:
    """What produced the run: the command line as typed, and the job's own Hydra overrides."""
    tags = {mlflow_tags.COMMAND: (result.command or "")[:5000]}
    tags[mlflow_tags.OVERRIDES] = shlex.join(result.overrides)[:5000] or "(defaults)"
    return tags


def log_prompts(result: Result) -> None:
    """The workload's prompts as an MLflow dataset input (the run page's Datasets column)."""
    import mlflow
    import pandas as pd
    from mlflow.exceptions import MlflowException

    texts = list(dict.fromkeys(text["prompt"] for text in result.texts))
    name, digest = result.workload().dataset_input(result.tags)  # a user's file: its name and content digest
    dataset = mlflow.data.from_pandas(pd.DataFrame({"prompt": texts}), name=name, digest=digest)
    try:
        mlflow.log_input(dataset, context="workload")
    except MlflowException:
        # Parallel jobs logging the same prompts to a tracking server race to create its one dataset
        # row (a UNIQUE constraint); the loser's second try finds the row the winner made.
        mlflow.log_input(dataset, context="workload")


def open_parent(
    tracking: TrackingConfig, launch_dir: Path, name: str, swept: dict[str, str], tags: dict[str, str], reopen: bool
) -> str:
    """A sweep's parent run, once its credentials pass the door (auth.TrackingRefused if not): with
    `reopen`, the same sweep's latest parent, RUNNING again, if it ran here before; else a new one."""
    check_at_door(tracking, launch_dir)
    parent = reopen_parent(tracking, launch_dir, name, swept, tags) if reopen else None
    if parent:
        log.info("resume: the new jobs join parent run %s of %r", parent, name)
        return parent
    return start_parent(tracking, launch_dir, name, swept, tags)


@forwarded  # in a sweep's tracking worker, if it has one (kvpipe.record.worker)
def start_parent(
    tracking: TrackingConfig, launch_dir: Path, name: str, swept: dict[str, str], tags: dict[str, str]
) -> str:
    """The parent run of a multirun, named by its sweep; its params are the swept keys and their
    values (`cache` = `dynamic,static,quantized`). Its children carry its id."""
    from mlflow.tracking import MlflowClient

    with recording(tracking, launch_dir) as experiment_id:
        client = MlflowClient()
        tags = {mlflow_tags.SWEEP: "true", mlflow_tags.SIGNATURE: sweep_signature(name, swept), **tags}
        run_id = client.create_run(experiment_id, run_name=name, tags=tags).info.run_id
        _log_params(client, run_id, swept)
        return run_id


def sweep_signature(name: str, swept: dict[str, str]) -> str:
    """Equal for the same sweep run again (resume=true finds its parent by it)."""
    return hashlib.sha256(json.dumps([name, swept], sort_keys=True).encode()).hexdigest()[:16]


@forwarded  # in a sweep's tracking worker, if it has one (kvpipe.record.worker)
def reopen_parent(
    tracking: TrackingConfig, launch_dir: Path, name: str, swept: dict[str, str], tags: dict[str, str]
) -> str | None:
    """resume=true: the latest parent run of this same sweep, RUNNING again for the new jobs (its
    children left RUNNING by a kill are marked KILLED; older parents of it left RUNNING, too).
    None if the sweep never ran here."""
    import mlflow
    from mlflow.tracking import MlflowClient

    with recording(tracking, launch_dir) as experiment_id:
        client = MlflowClient()
        parents = mlflow.search_runs(
            experiment_ids=[experiment_id],
            output_format="list",
            order_by=["attributes.start_time DESC"],
            filter_string=f"tags.`{mlflow_tags.SWEEP}` = 'true' and tags.`{mlflow_tags.SIGNATURE}` = '{sweep_signature(name, swept)}'",
        )
        if not parents:
            return None
        for run in parents:
            stale = mlflow.search_runs(
                experiment_ids=[experiment_id],
                output_format="list",
                filter_string=f"tags.`{mlflow_tags.PARENT}` = '{run.info.run_id}' and attributes.status = 'RUNNING'",
            )
            for child in stale:  # caught half-logged by the kill
                client.set_terminated(child.info.run_id, status="KILLED")
            if run is not parents[0] and run.info.status == "RUNNING":
                client.set_terminated(run.info.run_id, status="KILLED")
        run_id = parents[0].info.run_id
        for key, value in tags.items():
            client.set_tag(run_id, key, value)
        client.update_run(run_id, status="RUNNING")
        return run_id


@forwarded  # in a sweep's tracking worker, if it has one (kvpipe.record.worker)
def log_skipped(tracking: TrackingConfig, launch_dir: Path, result: Result, parent_run_id: str) -> str:
    """A skipped job as a child run of its sweep: named `skipped · <its overrides>`, tagged
    kvpipe.skipped with the reason, its params (when it had a valid config) and no metrics. FINISHED,
    as MLflow has no skipped status; compare, recommend and resume read only kvpipe.status=FINISHED."""
    from mlflow.tracking import MlflowClient

    with recording(tracking, launch_dir) as experiment_id:
        client = MlflowClient()
        tags = {
            mlflow_tags.PARENT: parent_run_id,
            mlflow_tags.STATUS: "SKIPPED",
            mlflow_tags.SKIPPED: result.reason[:5000],
        }
        name = "skipped · " + (shlex.join(result.overrides) or "(defaults)")
        run_id = client.create_run(experiment_id, run_name=name, tags={**tags, **origin_tags(result)}).info.run_id
        _log_params(client, run_id, result.params)
        client.set_terminated(run_id, status="FINISHED")
        return run_id


def _log_params(client, run_id: str, params: dict[str, str]) -> None:
    """Params in one request, each cut to MLflow's 6,000-character limit."""
    from mlflow.entities import Param

    client.log_batch(run_id, params=[Param(key, value[:6000]) for key, value in params.items()])


@forwarded  # in a sweep's tracking worker, if it has one (kvpipe.record.worker)
def end_parent(tracking: TrackingConfig, launch_dir: Path, run_id: str, status: str, counts: dict) -> None:
    from mlflow.tracking import MlflowClient

    with recording(tracking, launch_dir):
        client = MlflowClient()
        for name, value in counts.items():
            client.log_metric(run_id, f"jobs_{name}", value)
        client.set_terminated(run_id, status=status)


@forwarded  # in a sweep's tracking worker: MLflow's import and store are 3 s in the sweep's process
def log_rounds(tracking: TrackingConfig, launch_dir: Path, run_id: str, seconds: list[float], first_step: int) -> None:
    """A sweep's measured rounds on its parent run: each round's seconds, and its drift from the
    first round of its group (round_s and round_drift, one step per round)."""
    from mlflow.entities import Metric
    from mlflow.tracking import MlflowClient

    now = int(time.time() * 1000)
    metrics = []
    for index, value in enumerate(seconds):
        step = first_step + index
        metrics.append(Metric("round_s", value, now, step))
        metrics.append(Metric("round_drift", value / seconds[0] - 1 if seconds[0] else float("nan"), now, step))
    with recording(tracking, launch_dir):
        MlflowClient().log_batch(run_id, metrics=metrics)


def attach_files(run_id: str, paths: list[Path], artifact_dir: str, note: str) -> None:
    """Files logged on a run of the store MLflow points at (compare's, on a sweep's parent), under
    artifact_dir, and `note` as the run's description; auth.TrackingRefused where this user may not."""
    import mlflow
    from mlflow.tracking import MlflowClient

    with refusals(f"tracking.uri={mlflow.get_tracking_uri()}", f"the experiment of run {run_id}"):
        for path in paths:
            MlflowClient().log_artifact(run_id, str(path), artifact_dir)
        MlflowClient().set_tag(run_id, mlflow_tags.NOTE, note)


def finished_run_with_key(tracking: TrackingConfig, launch_dir: Path, key: str):
    """A FINISHED run in the experiment that measured exactly this, if any."""
    import mlflow

    with recording(tracking, launch_dir) as experiment_id:
        runs = mlflow.search_runs(
            experiment_ids=[experiment_id],
            output_format="list",
            max_results=1,
            filter_string=f"tags.`{mlflow_tags.KEY}` = '{key}' and attributes.status = 'FINISHED' "
            f"and {mlflow_tags.equals(mlflow_tags.STATUS, 'FINISHED')}",
        )
    return RunRecord.of(runs[0]) if runs else None
