"""One job end to end: spec -> run (kvpipe.job) -> record (result.json, MLflow) -> summary table."""

from __future__ import annotations

import logging
from pathlib import Path

from kvpipe.job import runner
from kvpipe.jobspec import Spec
from kvpipe.record import auth, recorder, report
from kvpipe.record.result import Result

log = logging.getLogger(__name__)


def run_pipeline(
    spec: Spec,
    run_dir: Path,
    launch_dir: Path,
    print_table: bool = True,
    parent_run_id: str | None = None,
    check_store: bool = True,
    order_tags: dict[str, str] | None = None,
) -> Result:
    """Run one job and record it; returns its Result. check_store: the store's credentials first
    (a sweep checks them once, at its start; its jobs then measure whatever happens to the store,
    their results kept on disk for `kvpipe sync` if it refuses or goes away). order_tags: how a
    sweep measured it (kvpipe.orchestrate.interleave)."""
    for warning in spec.warnings:
        log.warning(warning)
    if check_store:  # a refusal stops the job here, before the model loads
        outage = auth.check_credentials(spec.tracking, launch_dir)
        if outage:
            log.warning("%s; measuring anyway: the result will wait on disk for `kvpipe sync`", outage)
    return record_measured(
        spec, lambda: runner.run_job(spec, order_tags), run_dir, launch_dir, print_table, parent_run_id
    )


def record_measured(
    spec: Spec, measure, run_dir: Path, launch_dir: Path, print_table: bool, parent_run_id=None
) -> Result:
    """measure() (a JobResult) recorded as FINISHED, or as KILLED where Ctrl-C stops it."""
    try:
        job = measure()
    except KeyboardInterrupt:
        record_killed(spec, run_dir, launch_dir, parent_run_id)
        raise
    result = Result.finished(spec, job)
    path = recorder.record(spec, result, run_dir, launch_dir, parent_run_id)
    if print_table:
        report.print_run(result, path)
    return result


def record_killed(spec: Spec, run_dir: Path, launch_dir: Path, parent_run_id=None) -> None:
    """The job recorded as KILLED: Ctrl-C stopped it before it was whole."""
    killed = Result.unfinished(spec.as_dict(), "KILLED", "interrupted by the user (SIGINT)", spec=spec)
    recorder.record(spec, killed, run_dir, launch_dir, parent_run_id)
