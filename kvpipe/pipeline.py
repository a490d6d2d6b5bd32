"""The whole pipeline for one job: plan -> run -> result.json -> MLflow -> summary table.

result.json is always written first; MLflow is a copy. If MLflow cannot be reached, the result
stays on disk (marked unsynced) and `kvpipe sync` uploads it later, once.
"""

from __future__ import annotations

import logging
from pathlib import Path

from omegaconf import OmegaConf

from kvpipe import record, report, runner, tracking
from kvpipe.plan import Plan

log = logging.getLogger(__name__)


def run_pipeline(plan: Plan, run_dir: Path, launch_dir: Path, print_table: bool = True,
                 parent_run_id: str | None = None) -> dict:
    """Run one job and record it; returns the result document."""
    for warning in plan.warnings:
        log.warning(warning)
    try:
        result = runner.run_job(plan)
    except KeyboardInterrupt:
        document = record.unfinished_document(plan.as_dict(), "KILLED", "interrupted by the user (SIGINT)")
        record_document(plan, document, run_dir, launch_dir, parent_run_id)
        raise
    document = record.result_document(plan, result)
    path = record_document(plan, document, run_dir, launch_dir, parent_run_id)
    if print_table:
        report.print_summary(document, path)
    return document


def record_document(plan: Plan, document: dict, run_dir: Path, launch_dir: Path,
                    parent_run_id: str | None = None) -> Path:
    """result.json, then (tracking on) MLflow; the run id goes back into result.json once logged."""
    path = record.write_result(run_dir, document)  # on disk before any MLflow call
    log.info("wrote %s", path)
    if not plan.tracking.enabled:
        return path
    return sync_document(plan, document, run_dir, launch_dir, parent_run_id)


def sync_document(plan: Plan, document: dict, run_dir: Path, launch_dir: Path,
                  parent_run_id: str | None = None) -> Path:
    """Copy one result document to MLflow, unless it is there already."""
    path = run_dir / record.RESULT_FILE
    if document.get("mlflow_run_id"):
        return path
    parent_run_id = parent_run_id or document.get("mlflow_parent_run_id")
    try:
        run_id = tracking.log_job(plan.tracking, launch_dir, run_dir, plan.flat_params(), document,
                                  config_yaml(plan), parent_run_id, plan.measurement_key())
    except tracking.TrackingUnavailable as exc:
        document["mlflow_error"] = str(exc)
        document["mlflow_uri"] = tracking.store_paths(plan.tracking, launch_dir)[0]
        if parent_run_id:
            document["mlflow_parent_run_id"] = parent_run_id
        record.write_result(run_dir, document)
        log.warning("%s; the result is safe in %s; upload it later with: kvpipe sync %s", exc, path, run_dir)
        return path
    document.pop("mlflow_error", None)
    document["mlflow_run_id"] = run_id
    record.write_result(run_dir, document)
    log.info("MLflow run %s in experiment %r (%s)", run_id, plan.tracking.experiment,
             tracking.store_paths(plan.tracking, launch_dir)[0])
    return path


def config_yaml(plan: Plan) -> str:
    return OmegaConf.to_yaml(OmegaConf.structured(plan.as_dict()))
