"""MLflow: the default embedded SQLite store, experiments, and one run per job."""

from __future__ import annotations

import logging
from pathlib import Path

from kvpipe.config import TrackingConfig

log = logging.getLogger(__name__)

DB_FILE = "mlflow.db"
ARTIFACT_DIR = "mlartifacts"


def store_paths(tracking: TrackingConfig, launch_dir: Path) -> tuple[str, str | None]:
    """(tracking URI, artifact root). The default store is absolute, whatever the working dir."""
    if tracking.uri:
        if tracking.uri.startswith("sqlite:///"):  # keep artifacts beside the database, not in ./mlruns
            return tracking.uri, (Path(tracking.uri.removeprefix("sqlite:///")).parent / ARTIFACT_DIR).as_uri()
        return tracking.uri, None
    store = (launch_dir / tracking.store_dir).resolve()
    store.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{store / DB_FILE}", (store / ARTIFACT_DIR).as_uri()


def setup(tracking: TrackingConfig, launch_dir: Path) -> str:
    """Point MLflow at the store and make sure the experiment exists; return its id."""
    import mlflow

    uri, artifact_root = store_paths(tracking, launch_dir)
    mlflow.set_tracking_uri(uri)
    experiment = mlflow.get_experiment_by_name(tracking.experiment)
    if experiment is not None:
        return experiment.experiment_id
    return mlflow.create_experiment(tracking.experiment, artifact_location=artifact_root and
                                    f"{artifact_root}/{tracking.experiment}")


def log_job(tracking: TrackingConfig, launch_dir: Path, run_dir: Path, params: dict[str, str],
            document: dict, config_yaml: str) -> str:
    """One MLflow run: params, metrics, tags, and the config, texts and result.json as artifacts."""
    import mlflow

    experiment_id = setup(tracking, launch_dir)
    tags = {f"kvpipe.{k}": v for k, v in document["tags"].items()}
    metrics = {k: float(v) for k, v in document["metrics"].items() if v is not None}
    with mlflow.start_run(experiment_id=experiment_id, run_name=tracking.run_name or _run_name(document)) as run:
        mlflow.log_params(params)
        mlflow.set_tags(tags)
        mlflow.log_metrics(metrics)
        mlflow.log_text(config_yaml, "config.yaml")
        mlflow.log_dict({"texts": document["texts"]}, "texts.json")
        mlflow.log_artifact(str(run_dir / "result.json"))
        return run.info.run_id


def _run_name(document: dict) -> str:
    return document["tags"].get("cache.effective", "job")
