"""Where MLflow's store is and how to reach it: its URI and paths, the writer lock, and TrackingUnavailable.

The bottom of kvpipe.record's MLflow side: auth (credentials, refusals) and tracking (runs) build on it.
"""

from __future__ import annotations

import argparse
import logging
import os
from contextlib import nullcontext
from pathlib import Path

from kvpipe.config import TrackingConfig
from kvpipe.errors import KvpipeError
from kvpipe.record import tags as mlflow_tags

DB_FILE = "mlflow.db"
ARTIFACT_DIR = "mlartifacts"
URI_ENV = "MLFLOW_TRACKING_URI"
# A new store's schema migrations say each step at INFO ("Creating initial MLflow database tables...",
# alembic's "Context impl SQLiteImpl."): MLflow's housekeeping, not news for a first run. Warnings still show.
MIGRATION_LOGGERS = ("mlflow.store.db.utils", "alembic.runtime.migration")


class TrackingUnavailable(KvpipeError):
    """The tracking store could not be reached; results stay on disk for `kvpipe sync`."""


def default_uri(launch_dir: Path, store_dir: str = TrackingConfig.store_dir) -> str:
    """The default store: SQLite under the launch dir, as an absolute URI."""
    return f"sqlite:///{(launch_dir / store_dir / DB_FILE).resolve()}"


def resolve_uri(
    explicit: str | None,
    launch_dir: Path,
    spelled: str = "tracking.uri",
    store_dir: str = TrackingConfig.store_dir,
) -> tuple[str, str]:
    """(tracking URI, where it came from, as the user said it). One order everywhere (runs, compare,
    recommend, sync): the explicit setting, then $MLFLOW_TRACKING_URI, then the default store."""
    if explicit:
        return explicit, f"{spelled}={explicit}"
    if os.environ.get(URI_ENV):
        return os.environ[URI_ENV], f"{URI_ENV}={os.environ[URI_ENV]}"
    uri = default_uri(launch_dir, store_dir)
    return uri, f"the default store {uri.removeprefix('sqlite:///')}"


def point_mlflow_at(uri: str) -> None:
    """mlflow.set_tracking_uri, without its side effect on $MLFLOW_TRACKING_URI (MLflow exports the
    URI there for subprocesses): here that variable is the user's own setting, read by resolve_uri,
    and must not turn one store's address into every later run's."""
    import mlflow

    for name in MIGRATION_LOGGERS:  # every store kvpipe opens is opened after this
        logging.getLogger(name).setLevel(logging.WARNING)
    before = os.environ.get(URI_ENV)
    mlflow.set_tracking_uri(uri)
    if before is None:
        os.environ.pop(URI_ENV, None)
    else:
        os.environ[URI_ENV] = before


def add_store_argument(parser: argparse.ArgumentParser, what: str) -> None:
    """`tracking.uri=URI`, spelt as runs spell it (the CLI turns it into this option; --tracking-uri
    works too), resolved as runs resolve it: see resolve_uri."""
    parser.add_argument(
        "--tracking-uri",
        metavar="URI",
        help=f"{what}; also spelt tracking.uri=URI, as for runs "
        "(default: $MLFLOW_TRACKING_URI, else outputs/mlflow.db in the current dir)",
    )
    parser.set_defaults(uri_spelling="--tracking-uri")


def store_paths(tracking: TrackingConfig, launch_dir: Path) -> tuple[str, str | None]:
    """(tracking URI, artifact root), the URI as resolve_uri finds it. The default store is absolute,
    whatever the working dir, and made if missing."""
    uri, _ = resolve_uri(tracking.uri, launch_dir, store_dir=tracking.store_dir)
    if not uri.startswith("sqlite:///"):
        return uri, None
    store = Path(uri.removeprefix("sqlite:///")).parent  # artifacts beside the database, not in ./mlruns
    if uri == default_uri(launch_dir, tracking.store_dir):
        store.mkdir(parents=True, exist_ok=True)
    return uri, (store / ARTIFACT_DIR).as_uri()


def client_modules(uri: str) -> tuple[str, ...]:
    """What MLflow's client imports to write to `uri`: its SQLAlchemy store for a database, its REST
    store for a server (a sweep's tracking worker imports them first: kvpipe.record.worker)."""
    store = "rest_store" if uri.startswith(("http://", "https://", "databricks")) else "sqlalchemy_store"
    return ("mlflow.tracking", f"mlflow.store.tracking.{store}")


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


def open_experiment(tracking: TrackingConfig, launch_dir: Path) -> str:
    """Point MLflow at the store and make sure the experiment exists, shown as model development
    (mlflow_tags.EXPERIMENT_KIND); return its id."""
    import mlflow
    from mlflow.exceptions import MlflowException

    uri, artifact_root = store_paths(tracking, launch_dir)
    check_reachable(uri)
    # MLflow's default is 7 retries with exponential backoff (minutes) for a server that went away
    # mid-run; a few seconds is enough to ride out a blip, and the result is safe on disk anyway.
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "3")
    point_mlflow_at(uri)
    experiment = mlflow.get_experiment_by_name(tracking.experiment)
    if experiment is None:
        try:
            return mlflow.create_experiment(
                tracking.experiment,
                artifact_location=artifact_root and f"{artifact_root}/{tracking.experiment}",
                tags={mlflow_tags.EXPERIMENT_KIND: mlflow_tags.MODEL_DEVELOPMENT},
            )
        except MlflowException:  # another job created it a moment ago
            experiment = mlflow.get_experiment_by_name(tracking.experiment)
    if mlflow_tags.EXPERIMENT_KIND not in experiment.tags:  # made before kvpipe set it; a kind chosen stays
        mlflow.MlflowClient().set_experiment_tag(
            experiment.experiment_id, mlflow_tags.EXPERIMENT_KIND, mlflow_tags.MODEL_DEVELOPMENT
        )
    return experiment.experiment_id
