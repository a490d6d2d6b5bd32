"""Recording one job: result.json first (always), then MLflow (when tracking is on).

result.json is written before any MLflow call; MLflow is a copy. If MLflow cannot be reached, the
result stays on disk (marked unsynced) and `kvpipe sync` uploads it later, once.
"""

from __future__ import annotations

import logging
from pathlib import Path

from omegaconf import OmegaConf

from kvpipe.record import tracking
from kvpipe.record.result import RESULT_FILE, Result
from kvpipe.record.scored import write_files
from kvpipe.record.store import TrackingUnavailable, store_paths

log = logging.getLogger(__name__)


def record(spec, result: Result, run_dir: Path, launch_dir: Path, parent_run_id: str | None = None) -> Path:
    """result.json, then (tracking on) MLflow; the run id goes back into result.json once logged."""
    path = result.save(run_dir)  # on disk before any MLflow call
    log.info("wrote %s", path)
    if result.answers:  # the workload's own files (passkey: its heatmap)
        for written in write_files(result.scored(), run_dir, tracking.run_name(result)):
            log.info("wrote %s", written)
    if not spec.tracking.enabled:
        return path
    return upload(spec, result, run_dir, launch_dir, parent_run_id)


def upload(spec, result: Result, run_dir: Path, launch_dir: Path, parent_run_id: str | None = None) -> Path:
    """Copy one result to MLflow, unless it is there already."""
    path = run_dir / RESULT_FILE
    if result.mlflow_run_id:
        return path
    parent_run_id = parent_run_id or result.mlflow_parent_run_id
    try:
        run_id = tracking.log_job(
            spec.tracking, launch_dir, run_dir, result.params or spec.params(), result, config_yaml(spec), parent_run_id
        )
    except TrackingUnavailable as exc:
        result.mlflow_error = str(exc)
        result.mlflow_uri = store_paths(spec.tracking, launch_dir)[0]
        result.mlflow_parent_run_id = parent_run_id or None
        result.save(run_dir)
        log.warning("%s; the result is safe in %s; upload it later with: kvpipe sync %s", exc, path, run_dir)
        return path
    result.mlflow_error = None
    result.mlflow_run_id = run_id
    result.save(run_dir)
    uri = store_paths(spec.tracking, launch_dir)[0]
    log.info("MLflow run %s in experiment %r (%s)", run_id, spec.tracking.experiment, uri)
    return path


def config_yaml(spec) -> str:
    return OmegaConf.to_yaml(OmegaConf.structured(spec.as_dict()))
