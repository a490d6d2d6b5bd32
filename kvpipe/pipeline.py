"""One job end to end: spec -> run (kvpipe.job) -> record (result.json, MLflow) -> summary table."""

from __future__ import annotations

import logging
from pathlib import Path

from kvpipe.job import runner
from kvpipe.record import recorder, summary
from kvpipe.record.result import Result
from kvpipe.spec import Spec

log = logging.getLogger(__name__)


def run_pipeline(
    spec: Spec, run_dir: Path, launch_dir: Path, print_table: bool = True, parent_run_id: str | None = None
) -> Result:
    """Run one job and record it; returns its Result."""
    for warning in spec.warnings:
        log.warning(warning)
    try:
        job = runner.run_job(spec)
    except KeyboardInterrupt:
        killed = Result.unfinished(spec.as_dict(), "KILLED", "interrupted by the user (SIGINT)", spec=spec)
        recorder.record(spec, killed, run_dir, launch_dir, parent_run_id)
        raise
    result = Result.finished(spec, job)
    path = recorder.record(spec, result, run_dir, launch_dir, parent_run_id)
    if print_table:
        summary.print_summary(result, path)
    return result
