"""Each job once in MLflow, through every kill: before a job's run is created, the store is searched
for a run that holds it already.

A record (result.json) gets its own `job_id` when it is made, and is on disk before any MLflow call;
its run carries the id as a tag (kvpipe.job_id). The live recorder and `kvpipe sync` both upload
through `run_holding`, with one search per record:

- its own run, whole and closed (the status tag, set last, agrees with MLflow's status): the record
  is there; its run id is written back. A kill after the run was logged and before result.json got
  its id (the sweep's process killed while its tracking worker logged) costs nothing.
- its own run, half-logged (created, then the process was killed: RUNNING, or KILLED by a resumed
  sweep): deleted, and the record is logged whole in a new run. MLflow's delete is soft (`mlflow gc`
  purges it), and a half copy kept beside the whole one would list the job twice.
- a FINISHED record of a sweep's job, and under the same parent run (a resumed sweep reuses it)
  another record's FINISHED run of the same measurement: a resumed sweep measured the job again
  before this record was synced; that run holds the job, and this record is not uploaded.

The caller holds auth.recording: on a SQLite store one writer at a time, so the search, the create
and the logging are one step even with `kvpipe sync` running beside a sweep. A tracking server does
not serialise writers: a sync of results that a live sweep is still recording could create a second
run, or delete the run being logged; sync a sweep's folder after it ended or was killed.
"""

from __future__ import annotations

import logging

from kvpipe.record import tags as mlflow_tags
from kvpipe.record.result import Result

log = logging.getLogger(__name__)


def run_holding(client, experiment_id: str, result: Result, parent_run_id: str | None) -> str | None:
    """The id of the run that holds this record's job already, or None to log it; its own half-logged
    copies deleted first."""
    runs = client.search_runs([experiment_id], _search(result, parent_run_id), order_by=["attributes.start_time ASC"])
    own = [run for run in runs if run.data.tags.get(mlflow_tags.JOB_ID) == result.job_id]
    for run in own:
        if not closed(run, result.status):
            log.info("deleting run %s: a half-logged copy of %s (killed while logging)", run.info.run_id, result.job_id)
            client.delete_run(run.info.run_id)
    whole = [run for run in own if closed(run, result.status)]
    if whole:
        return whole[0].info.run_id
    if result.status != "FINISHED":
        return None
    measured = [run for run in runs if run not in own and closed(run, "FINISHED")]
    return measured[0].info.run_id if measured else None


def closed(run, status: str) -> bool:
    """Logged whole and closed by its writer: kvpipe's status tag (set last) and MLflow's status both `status`."""
    return run.data.tags.get(mlflow_tags.STATUS) == status and run.info.status == status


def _search(result: Result, parent_run_id: str | None) -> str:
    """A sweep's FINISHED job: every run of its measurement under its parent (its own among them);
    else its own runs."""
    if result.status == "FINISHED" and parent_run_id and result.measurement_key:
        return (
            f"{mlflow_tags.equals(mlflow_tags.PARENT, parent_run_id)} and "
            f"{mlflow_tags.equals(mlflow_tags.KEY, result.measurement_key)}"
        )
    return mlflow_tags.equals(mlflow_tags.JOB_ID, result.job_id)
