"""What a job a sweeper launched measured, read back for the sweeper's next choice (the search's
study, capacity's walks): its own result.json, or, where resume=true skipped it as already FINISHED
(kvpipe.orchestrate.skips), that earlier run in MLflow."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from kvpipe.record import tags as mlflow_tags
from kvpipe.record.result import Result


@dataclass(frozen=True)
class Measured:
    metrics: dict
    params: dict
    tags: dict  # by MLflow tag name, as a run read back from MLflow has them
    where: str  # "job 3", or "run 1a2b3c4d" where it was reused
    reused: bool


def read_back(job, spec, launch_dir: Path) -> tuple[Measured | None, Result | None, str]:
    """(what the job measured or None, its record or None where it has none, why not where None)."""
    run_dir = Path(job.hydra_cfg.hydra.runtime.output_dir)
    try:
        result = Result.load(run_dir / "result.json")
    except (OSError, ValueError) as exc:
        return None, None, f"no result.json in {run_dir}: {exc}"
    if result.status == "FINISHED":
        tags = {mlflow_tags.of(k): v for k, v in result.tags.items()}
        return Measured(result.metrics, result.params, tags, f"job {run_dir.name}", reused=False), result, ""
    if result.status == "SKIPPED" and result.measurement_key and "already FINISHED" in (result.reason or ""):
        from kvpipe.record import tracking

        run = tracking.finished_run_with_key(spec.tracking, launch_dir, result.measurement_key)
        if run is not None:
            return Measured(run.metrics, run.params, run.tags, f"run {run.run_id[:8]}", reused=True), result, ""
    return None, result, f"{result.status}: {result.reason or ''}".strip()
