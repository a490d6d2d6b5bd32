"""Recording one job: result.json first (always), then MLflow (when tracking is on).

result.json is written before any MLflow call, with its job id and its sweep's parent run; MLflow is
a copy. If MLflow cannot be reached, the result stays on disk (marked unsynced) and `kvpipe sync`
uploads it later, once: an upload looks for the record's own run first (kvpipe.record.exactly_once).
"""

from __future__ import annotations

import logging
from pathlib import Path

from omegaconf import OmegaConf

from kvpipe import kill_points
from kvpipe.record import requests, tracking
from kvpipe.record.result import RESULT_FILE, Result, new_job_id
from kvpipe.record.scored import write_files
from kvpipe.record.store import TrackingUnavailable, store_paths

log = logging.getLogger(__name__)


def record(spec, result: Result, run_dir: Path, launch_dir: Path, parent_run_id: str | None = None) -> Path:
    """result.json, then (tracking on) MLflow; the run id goes back into result.json once logged."""
    result.mlflow_parent_run_id = parent_run_id or result.mlflow_parent_run_id  # sync finds the sweep's job by it
    path = result.save(run_dir)  # on disk before any MLflow call
    log.info("wrote %s", path)
    kill_points.reached("after_result")
    if result.answers:  # the workload's own files (passkey: its heatmap)
        for written in write_files(result.scored(), run_dir, tracking.run_name(result)):
            log.info("wrote %s", written)
    if result.requests:  # a served run's requests: its trace and timeline, titled with the load they met
        title = " · ".join(filter(None, [tracking.run_name(result), result.tags.get("load")]))
        for written in requests.write_files(result.requests, run_dir, title):
            log.info("wrote %s", written)
    if spec.tracking.enabled:
        upload(spec, result, run_dir, launch_dir, parent_run_id)
    return path


def upload(
    spec, result: Result, run_dir: Path, launch_dir: Path, parent_run_id: str | None = None
) -> tracking.Logged | None:
    """Copy one result to MLflow, unless it is there already; its run (None: the store is unreachable,
    the result kept for `kvpipe sync`)."""
    path = run_dir / RESULT_FILE
    if result.mlflow_run_id:
        return tracking.Logged(result.mlflow_run_id, new=False)
    parent_run_id = parent_run_id or result.mlflow_parent_run_id
    if result.job_id is None:  # written by a kvpipe before job ids: given one, on disk before the upload
        result.job_id = new_job_id()
        result.save(run_dir)
    try:
        logged = tracking.log_job(
            spec.tracking, launch_dir, run_dir, result.params or spec.params(), result, config_yaml(spec), parent_run_id
        )
    except TrackingUnavailable as exc:
        result.mlflow_error = str(exc)
        result.mlflow_uri = store_paths(spec.tracking, launch_dir)[0]
        result.mlflow_parent_run_id = parent_run_id or None
        result.save(run_dir)
        log.warning("%s; the result is safe in %s; upload it later with: kvpipe sync %s", exc, path, run_dir)
        return None
    result.mlflow_error = None
    result.mlflow_run_id = logged.run_id
    result.save(run_dir)
    uri = store_paths(spec.tracking, launch_dir)[0]
    held = "" if logged.new else "already there, not logged again: "
    log.info("%sMLflow run %s in experiment %r (%s)", held, logged.run_id, spec.tracking.experiment, uri)
    return logged


def config_yaml(spec) -> str:
    return OmegaConf.to_yaml(OmegaConf.structured(spec.as_dict()))
