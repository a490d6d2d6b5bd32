"""When a sweep's job is skipped rather than run, and how a skip is recorded: a job that measures
what an earlier job of the sweep measured (settings its strategy ignores differ), or, with
resume=true, what a FINISHED run in the experiment measured already."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from kvpipe.record import store, tracking
from kvpipe.record import tags as mlflow_tags
from kvpipe.record.result import Result, iter_results

log = logging.getLogger(__name__)


def reason_to_skip(spec, key: str, resume: bool, sweep_dir: Path, run_dir: Path, launch_dir: Path,
                   parent: str | None) -> tuple[str, bool] | None:  # fmt: skip
    """(why the job is skipped, whether MLflow should list it under the parent), or None to run it."""
    earlier = _earlier_job_with_key(sweep_dir, run_dir, key)
    if earlier:
        return f"measures the same as job {earlier} (settings this strategy ignores differ)", True
    if resume and spec.tracking.enabled:
        done = tracking.finished_run_with_key(spec.tracking, launch_dir, key)
        if done:
            # under this parent already (a resumed sweep): no second entry for it in the UI
            visible = done.tags.get(mlflow_tags.PARENT) != parent
            return f"already FINISHED as MLflow run {done.run_id} (resume=true)", visible
    return None


@dataclass
class Skipper:
    """Records a skipped job: result.json, and a child run of the sweep's parent tagged with why,
    so that the MLflow UI lists it among the jobs (the parent's count alone does not say which)."""

    run_dir: Path
    launch_dir: Path
    parent: str | None
    overrides: list[str]
    cfg: DictConfig

    def __call__(self, config: dict, reason: str, key=None, spec=None, log_to_mlflow: bool = True) -> str:
        log.warning("skipped: %s", reason)
        result = Result.unfinished(config, "SKIPPED", reason, measurement_key=key, spec=spec, overrides=self.overrides)
        result.save(self.run_dir)
        tracking_cfg = spec.tracking if spec else _tracking_config(self.cfg)
        if log_to_mlflow and self.parent and tracking_cfg and tracking_cfg.enabled:
            try:
                result.mlflow_run_id = tracking.log_skipped(tracking_cfg, self.launch_dir, result, self.parent)
                result.save(self.run_dir)
            except store.TrackingUnavailable as exc:  # the skip is on disk; the UI just misses it
                log.warning("%s; skipped job not shown in MLflow", exc)
        return "SKIPPED"


def _tracking_config(cfg: DictConfig):
    """The job's tracking settings, even when another group made its config invalid."""
    try:
        return OmegaConf.to_object(cfg.tracking)
    except Exception:  # noqa: BLE001 - an invalid tracking group: nothing to log to
        return None


PENDING_FILE = "pending.json"  # a job prepared and waiting for its interleaved rounds: its key


def mark_pending(run_dir: Path, key: str) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / PENDING_FILE).write_text(json.dumps({"measurement_key": key}) + "\n")


def unmark_pending(run_dir: Path) -> None:
    (run_dir / PENDING_FILE).unlink(missing_ok=True)


def _earlier_job_with_key(sweep_dir: Path, run_dir: Path, key: str) -> str | None:
    """The sweep's job that measured (or, interleaved, is about to measure) the same key."""
    for path, result in iter_results(sweep_dir):
        if path.parent != run_dir and result.measurement_key == key and result.status == "FINISHED":
            return path.parent.name
    for path in sorted(sweep_dir.glob(f"*/{PENDING_FILE}")):
        if path.parent != run_dir and json.loads(path.read_text()).get("measurement_key") == key:
            return path.parent.name
    return None
