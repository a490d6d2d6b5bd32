"""MLflow: the default embedded SQLite store, experiments, and one run per job."""

from __future__ import annotations

import logging
import os
from contextlib import contextmanager, nullcontext
from pathlib import Path

from kvpipe.config import TrackingConfig
from kvpipe.errors import KvpipeError, first_line
from kvpipe.record.result import RESULT_FILE, Result

log = logging.getLogger(__name__)

DB_FILE = "mlflow.db"
ARTIFACT_DIR = "mlartifacts"


def default_uri(launch_dir: Path, store_dir: str = TrackingConfig.store_dir) -> str:
    """The default store: SQLite under the launch dir, as an absolute URI."""
    return f"sqlite:///{(launch_dir / store_dir / DB_FILE).resolve()}"


def store_paths(tracking: TrackingConfig, launch_dir: Path) -> tuple[str, str | None]:
    """(tracking URI, artifact root). The default store is absolute, whatever the working dir."""
    if tracking.uri:
        if tracking.uri.startswith("sqlite:///"):  # keep artifacts beside the database, not in ./mlruns
            return tracking.uri, (Path(tracking.uri.removeprefix("sqlite:///")).parent / ARTIFACT_DIR).as_uri()
        return tracking.uri, None
    store = (launch_dir / tracking.store_dir).resolve()
    store.mkdir(parents=True, exist_ok=True)
    return default_uri(launch_dir, tracking.store_dir), (store / ARTIFACT_DIR).as_uri()


class TrackingUnavailable(KvpipeError):
    """The tracking store could not be reached; results stay on disk for `kvpipe sync`."""


def writer_lock(tracking: TrackingConfig, launch_dir: Path):
    """SQLite allows one writer at a time and answers others "database is locked"; parallel
    jobs (joblib, submitit) therefore take turns through a file lock beside the database.
    A tracking server serialises writes itself."""
    uri, _ = store_paths(tracking, launch_dir)
    if not uri.startswith("sqlite:///"):
        return nullcontext()
    from filelock import FileLock

    return FileLock(uri.removeprefix("sqlite:///") + ".lock", timeout=600)


def check_reachable(uri: str, timeout_s: float = 5.0) -> None:
    """Fail fast on a tracking server that does not answer, instead of MLflow's minutes of retries."""
    if not uri.startswith(("http://", "https://")):
        return
    import urllib.error
    import urllib.request

    try:
        urllib.request.urlopen(uri.rstrip("/") + "/health", timeout=timeout_s).close()
    except (urllib.error.URLError, OSError) as exc:
        raise TrackingUnavailable(f"MLflow tracking server {uri} is unreachable ({exc})") from exc


def setup(tracking: TrackingConfig, launch_dir: Path) -> str:
    """Point MLflow at the store and make sure the experiment exists; return its id."""
    import mlflow
    from mlflow.exceptions import MlflowException

    uri, artifact_root = store_paths(tracking, launch_dir)
    check_reachable(uri)
    # MLflow's default is 7 retries with exponential backoff (minutes) for a server that went away
    # mid-run; a few seconds is enough to ride out a blip, and the result is safe on disk anyway.
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "3")
    mlflow.set_tracking_uri(uri)
    experiment = mlflow.get_experiment_by_name(tracking.experiment)
    if experiment is not None:
        return experiment.experiment_id
    try:
        return mlflow.create_experiment(
            tracking.experiment, artifact_location=artifact_root and f"{artifact_root}/{tracking.experiment}"
        )
    except MlflowException:  # another job created it a moment ago
        return mlflow.get_experiment_by_name(tracking.experiment).experiment_id


@contextmanager
def recording(tracking: TrackingConfig, launch_dir: Path):
    """Around every write: one writer at a time, and an unreachable store as one clear error."""
    from mlflow.exceptions import MlflowException

    with writer_lock(tracking, launch_dir):
        try:
            yield setup(tracking, launch_dir)
        except MlflowException as exc:
            uri = store_paths(tracking, launch_dir)[0]
            raise TrackingUnavailable(f"MLflow at {uri} failed: {first_line(exc)}") from exc


PARENT_TAG = "mlflow.parentRunId"  # MLflow's own nesting tag: the UI shows children under the parent
KEY_TAG = "kvpipe.measurement_key"


def log_job(
    tracking: TrackingConfig,
    launch_dir: Path,
    run_dir: Path,
    params: dict[str, str],
    result: Result,
    config_yaml: str,
    parent_run_id: str | None = None,
) -> str:
    """One MLflow run: params, metrics, tags, and the config, texts and result.json as artifacts.

    A FAILED result becomes a FAILED run with its error and traceback; the context manager
    also marks the run FAILED if logging itself breaks, so no run is left RUNNING."""
    with recording(tracking, launch_dir) as experiment_id:
        return _log_job(tracking, experiment_id, run_dir, params, result, config_yaml, parent_run_id)


def _log_job(tracking, experiment_id, run_dir, params, result: Result, config_yaml, parent_run_id) -> str:
    import mlflow

    tags = {f"kvpipe.{k}": v for k, v in result.tags.items()}
    if parent_run_id:
        tags[PARENT_TAG] = parent_run_id
    if result.measurement_key:
        tags[KEY_TAG] = result.measurement_key
    if result.reason:
        tags["kvpipe.error"] = result.reason[:5000]
    metrics = {k: float(v) for k, v in result.metrics.items() if v is not None}
    run_name = tracking.run_name or result.tags.get("cache.effective") or result.config["cache"]["strategy"]
    with mlflow.start_run(experiment_id=experiment_id, run_name=run_name, tags=tags) as run:
        mlflow.log_params(params)
        mlflow.log_metrics(metrics)
        mlflow.log_text(config_yaml, "config.yaml")
        if result.texts:
            mlflow.log_dict({"texts": result.texts}, "texts.json")
        if result.traceback:
            mlflow.log_text(result.traceback, "traceback.txt")
        mlflow.log_artifact(str(run_dir / RESULT_FILE))
        # Last: a run killed while logging never claims to hold a complete result
        mlflow.set_tag("kvpipe.status", result.status)
        run_id = run.info.run_id
    if result.status != "FINISHED":  # kvpipe's FAILED and KILLED are MLflow's own terminal statuses
        mlflow.tracking.MlflowClient().set_terminated(run_id, status=result.status)
    return run_id


def start_parent(tracking: TrackingConfig, launch_dir: Path, name: str, tags: dict[str, str]) -> str:
    """The parent run of a multirun; its children carry its id."""
    from mlflow.tracking import MlflowClient

    with recording(tracking, launch_dir) as experiment_id:
        tags = {"kvpipe.sweep": "true", **tags}
        return MlflowClient().create_run(experiment_id, run_name=name, tags=tags).info.run_id


def end_parent(tracking: TrackingConfig, launch_dir: Path, run_id: str, status: str, summary: dict) -> None:
    from mlflow.tracking import MlflowClient

    with recording(tracking, launch_dir):
        client = MlflowClient()
        for name, value in summary.items():
            client.log_metric(run_id, f"jobs_{name}", value)
        client.set_terminated(run_id, status=status)


def finished_run_with_key(tracking: TrackingConfig, launch_dir: Path, key: str) -> str | None:
    """The id of a FINISHED run in the experiment that measured exactly this, if any."""
    import mlflow

    with recording(tracking, launch_dir) as experiment_id:
        runs = mlflow.search_runs(
            experiment_ids=[experiment_id],
            output_format="list",
            max_results=1,
            filter_string=f"tags.`{KEY_TAG}` = '{key}' and attributes.status = 'FINISHED' "
            "and tags.`kvpipe.status` = 'FINISHED'",
        )
    return runs[0].info.run_id if runs else None


def close_stale_parents(tracking: TrackingConfig, launch_dir: Path, name: str) -> int:
    """Mark KILLED the RUNNING parents of an earlier, killed sweep of this name (a SIGKILL
    gives no chance to close them); returns how many."""
    import mlflow
    from mlflow.tracking import MlflowClient

    with recording(tracking, launch_dir) as experiment_id:
        stale = mlflow.search_runs(
            experiment_ids=[experiment_id],
            output_format="list",
            filter_string="tags.`kvpipe.sweep` = 'true' and attributes.status = 'RUNNING'",
        )
        stale = [run for run in stale if run.info.run_name == name]
        for run in stale:
            # children caught half-logged by the kill, then the parent
            children = mlflow.search_runs(
                experiment_ids=[experiment_id],
                output_format="list",
                filter_string=f"tags.`{PARENT_TAG}` = '{run.info.run_id}' and attributes.status = 'RUNNING'",
            )
            for child in children:
                MlflowClient().set_terminated(child.info.run_id, status="KILLED")
            MlflowClient().set_terminated(run.info.run_id, status="KILLED")
    return len(stale)
