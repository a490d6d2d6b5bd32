"""A workload's own scoring (kvpipe.workload.Scored) recorded the same way for every workload: its
files beside result.json, and in MLflow its stepped series, tables and files (the run's metrics
already hold its figures). Rebuilt from result.json's rows (Result.scored), so a job just run and
one `kvpipe sync` uploads later log the same things."""

from __future__ import annotations

import time
from pathlib import Path

from kvpipe.workload import Scored


def write_files(scored: Scored, run_dir: Path, title: str) -> list[Path]:
    """Its files beside result.json (passkey: the heatmap); the paths written."""
    written = []
    for file in scored.files:
        file.write(run_dir / file.name, title)
        written.append(run_dir / file.name)
    return written


def log_scored(run_id: str, run_dir: Path, scored: Scored) -> None:
    """Inside the run's MLflow context: the stepped series, the tables (the run's Evaluation view),
    and each file written beside result.json, under its artifact folder."""
    import mlflow
    import pandas as pd
    from mlflow.entities import Metric
    from mlflow.tracking import MlflowClient

    if scored.steps:
        now = int(time.time() * 1000)
        points = [Metric(point.series, point.value, now, point.step) for point in scored.steps]
        MlflowClient().log_batch(run_id, metrics=points)
    for artifact, rows in scored.tables.items():
        mlflow.log_table(pd.DataFrame(rows), artifact)
    for file in scored.files:
        if (run_dir / file.name).is_file():
            mlflow.log_artifact(str(run_dir / file.name), file.artifact_dir)
