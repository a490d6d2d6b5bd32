"""The whole pipeline for one job: plan -> run -> result.json -> MLflow -> summary table."""

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
    result = runner.run_job(plan)
    document = record.result_document(plan, result)
    path = record.write_result(run_dir, document)  # on disk before any MLflow call
    log.info("wrote %s", path)
    if plan.tracking.enabled:
        run_id = tracking.log_job(plan.tracking, launch_dir, run_dir, plan.flat_params(), document,
                                  config_yaml(plan), parent_run_id, plan.measurement_key())
        document["mlflow_run_id"] = run_id
        log.info("MLflow run %s in experiment %r (%s)", run_id, plan.tracking.experiment,
                 tracking.store_paths(plan.tracking, launch_dir)[0])
    if print_table:
        report.print_summary(document, path)
    return document


def config_yaml(plan: Plan) -> str:
    return OmegaConf.to_yaml(OmegaConf.structured(plan.as_dict()))
